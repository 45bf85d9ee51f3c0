package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimprom"
)

// serveMetrics serves the run's metrics (zclaimprom) at cfg.metrics. The
// function it returns keeps serving for cfg.hold (until Ctrl-C or SIGTERM when 0),
// then stops the server.
func serveMetrics(w io.Writer, cfg config, b *zclaim.Broker, ds []*zclaim.Dispatcher, idem *zclaim.Idempotency) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(zclaimprom.NewCollector(zclaimprom.Options{
		Brokers: []*zclaim.Broker{b}, Dispatchers: ds, Idempotency: []*zclaim.Idempotency{idem},
	}))
	l, err := net.Listen("tcp", cfg.metrics)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	fmt.Fprintf(w, "metrics: curl http://%s/metrics\n", l.Addr())
	return func() {
		if cfg.hold > 0 {
			fmt.Fprintf(w, "serving metrics for %v more\n", cfg.hold)
			time.Sleep(cfg.hold)
		} else {
			fmt.Fprintln(w, "serving metrics until Ctrl-C (or SIGTERM)")
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			<-ctx.Done()
			stop()
		}
		srv.Close()
	}, nil
}
