// Command otelbench measures what zclaimotel's middleware costs: an asynq
// server working off pending tasks (no-op handler) under the idempotency
// middleware alone, and with zclaimotel.Middleware inside it on a no-op
// TracerProvider, on an SDK that samples nothing, and on an SDK that
// records every span (into a processor that drops it), side by side in
// interleaved rounds. make bench appends its table to bench/RESULTS.md.
//
//	go run ./internal/otelbench
//
// Exit codes: 0 done, 1 a run failed, 2 bad flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimotel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func main() {
	rounds := flag.Int("rounds", 9, "interleaved rounds")
	n := flag.Int("n", 20000, "tasks a contender works off in a round")
	flag.Parse()
	if *rounds < 1 || *n < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "otelbench: -rounds and -n must be at least 1, and there are no arguments")
		os.Exit(2)
	}
	if err := run(*rounds, *n); err != nil {
		fmt.Fprintln(os.Stderr, "otelbench:", err)
		os.Exit(1)
	}
}

type contender struct {
	name string
	tp   trace.TracerProvider // nil: no zclaimotel middleware
}

// drop is a span processor that ends spans and keeps nothing: what a
// recording SDK costs before its exporter.
type drop struct{}

func (drop) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (drop) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (drop) Shutdown(context.Context) error                  { return nil }
func (drop) ForceFlush(context.Context) error                { return nil }

func run(rounds, n int) error {
	redis.SetLogger(redisproc.QuietRedis{})
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	contenders := []contender{
		{name: "idempotency middleware alone"},
		{name: "+ zclaimotel.Middleware, no-op TracerProvider", tp: noop.NewTracerProvider()},
		{name: "+ zclaimotel.Middleware, SDK sampling nothing", tp: sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		{name: "+ zclaimotel.Middleware, SDK recording every span (a processor that drops them)",
			tp: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(drop{}))},
		{name: "idempotency middleware alone, again (the first row's twin: its ratio is the noise of a ratio)"},
	}
	rates := make([][]float64, len(contenders))
	for r := range rounds {
		for i := range contenders {
			k := (i + r) % len(contenders) // each takes each place in turn
			rate, err := round(srv.Addr, contenders[k], n, r)
			if err != nil {
				return err
			}
			rates[k] = append(rates[k], rate)
			fmt.Fprintf(os.Stderr, "otelbench: round %d/%d, %s: %.0f tasks/s\n", r+1, rounds, contenders[k].name, rate)
		}
	}
	fmt.Printf("### zclaimotel: the middleware's cost\n\n")
	fmt.Printf("An asynq server (Concurrency 16, TaskCheckInterval 10 ms) works off %d pending tasks with a no-op handler under the idempotency middleware (on the store's AsynqClient), with zclaimotel.Middleware inside it or not; each task carries a sampled W3C traceparent, as zclaimotel.EnqueueHook writes it. %d interleaved rounds, each contender taking each place in turn; a ratio is the median of the per-round ratios to the first row.\n\n", n, rounds)
	fmt.Println("| contender | tasks/s (median) | ratio | rounds' ratios (min–max) |")
	fmt.Println("|---|---|---|---|")
	for k, c := range contenders {
		var ratios []float64
		for r := range rates[k] {
			ratios = append(ratios, rates[k][r]/rates[0][r])
		}
		slices.Sort(ratios)
		fmt.Printf("| %s | %.0f | **%.2f×** | %.2f–%.2f |\n", c.name, median(rates[k]), median(ratios), ratios[0], ratios[len(ratios)-1])
	}
	fmt.Println()
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// round works off n tasks with contender c and returns its rate.
func round(addr string, c contender, n, r int) (float64, error) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32})
	defer rdb.Close()
	queue := "otelbench-" + strconv.Itoa(r) + "-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: queue + ":run:", DisableTakeover: true})
	if err != nil {
		return 0, err
	}
	defer idem.Close()
	ac := asynq.NewClientFromRedisClient(rdb)
	task := asynq.NewTaskWithHeaders("work", nil,
		map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	for i := range n {
		if _, err := ac.Enqueue(task, asynq.Queue(queue), asynq.TaskID("t"+strconv.Itoa(i)), asynq.Retention(0)); err != nil {
			return 0, err
		}
	}
	var done atomic.Int64
	finished := make(chan struct{})
	mux := asynq.NewServeMux()
	mw := []asynq.MiddlewareFunc{idem.Middleware()}
	if c.tp != nil {
		mw = append(mw, zclaimotel.Middleware(zclaimotel.WithTracerProvider(c.tp)))
	}
	mux.Use(mw...)
	mux.HandleFunc("work", func(context.Context, *asynq.Task) error {
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{Queues: map[string]int{queue: 1},
		Concurrency: 16, TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	start := time.Now()
	if err := srv.Start(mux); err != nil {
		return 0, err
	}
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		srv.Shutdown()
		return 0, fmt.Errorf("%s: %d of %d tasks in 5 min", c.name, done.Load(), n)
	}
	elapsed := time.Since(start)
	srv.Shutdown()
	ac.Close()
	keys, _ := rdb.Keys(ctx, "*"+queue+"*").Result()
	for i := 0; i < len(keys); i += 1000 {
		rdb.Del(ctx, keys[i:min(i+1000, len(keys))]...)
	}
	rdb.SRem(ctx, "asynq:queues", queue)
	return float64(n) / elapsed.Seconds(), nil
}
