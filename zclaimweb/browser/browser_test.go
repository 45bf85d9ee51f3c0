package browser

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimweb/internal/webtest"
)

// browser is the allocator of the one Chromium the tests share; each test
// opens tabs of its own. Empty when no Chromium was found.
var browser context.Context

const install = "the console's browser tests need Chromium: apt-get install -y chromium"

func TestMain(m *testing.M) {
	if err := webtest.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := func() int {
		path := chromium()
		if path == "" {
			if os.Getenv("ZCLAIM_CI") != "" {
				fmt.Fprintln(os.Stderr, install+" (CI runs every test)")
				return 2
			}
			fmt.Fprintln(os.Stderr, install+"; they are skipped")
			return m.Run()
		}
		// The flags these machines need: headless, no sandbox (root), no
		// GPU, and nothing that reaches for the network.
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
			chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
			chromedp.Flag("no-first-run", true), chromedp.Flag("disable-quic", true),
			// A name of an attacker's that resolves to the console's
			// loopback address: DNS rebinding, with no DNS.
			chromedp.Flag("host-resolver-rules", "MAP rebound.test 127.0.0.1"))
		dir, err := os.MkdirTemp("", "zclaim-chromium-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.RemoveAll(dir)
		opts = append(opts, chromedp.UserDataDir(dir))
		alloc, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
		defer cancel()
		// The first tab starts the browser; the tests' tabs share it.
		b, cancelB := chromedp.NewContext(alloc)
		defer cancelB()
		if err := chromedp.Run(b); err != nil {
			fmt.Fprintf(os.Stderr, "chromium at %s does not start: %v\n", path, err)
			return 2
		}
		browser = b
		return m.Run()
	}()
	webtest.Redis.Close()
	os.Exit(code)
}

func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// tab opens a tab of the shared browser for t, and counts the JavaScript
// dialogs (alert, confirm) that open in it, dismissing each.
func tab(t *testing.T) (context.Context, *atomic.Int32) {
	t.Helper()
	if browser == nil {
		t.Skip(install)
	}
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	ctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancelT)
	var dialogs atomic.Int32
	chromedp.ListenTarget(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			go chromedp.Run(ctx, page.HandleJavaScriptDialog(false))
		}
	})
	return ctx, &dialogs
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// The overview shows the seeded schedule's counts and updates them
// without a reload when the schedule changes.
func TestOverviewLive(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{})
	e.Seed(t, 30)
	e.Kill(t, "dead-1", "attempts exhausted")
	var scheduled, dead, loads string
	run(t, ctx, chromedp.Navigate(e.URL+"/"),
		chromedp.Text("#s0-scheduled", &scheduled, chromedp.ByQuery),
		chromedp.Text("#s0-dead", &dead, chromedp.ByQuery))
	if scheduled != "30" || dead != "1" {
		t.Fatalf("overview shows %s scheduled, %s dead; want 30 and 1", scheduled, dead)
	}
	run(t, ctx, chromedp.Evaluate(`window.zclaimLoaded = 1; "ok"`, &loads))
	if err := e.Broker.Schedule(context.Background(), zclaim.Job{ID: "new", RunAt: time.Now().Add(time.Hour), Type: "t"}); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Poll(`document.querySelector("#s0-scheduled").textContent === "31"`, nil,
		chromedp.WithPollingTimeout(10*time.Second)))
	var same bool
	run(t, ctx, chromedp.Evaluate(`window.zclaimLoaded === 1`, &same))
	if !same {
		t.Fatal("the count changed by a reload, not in place")
	}
}

// Paging through 100,000 scheduled jobs: each page, near the start and
// deep in the set, is delivered in under 300 ms (from its request to the
// last byte of its HTML), and parsed with its scripts run in under a
// second (DOMContentLoaded), both the best of up to five loads. The parse
// is Chromium's work, which a busy machine stretches (two busy loops on
// two cores take it past 300 ms): its bound catches a page grown heavy.
func TestPaging100k(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{PageSize: 100})
	e.Seed(t, 100_000)
	// A cursor 90,000 jobs in, through the lookup API.
	after := ""
	for range 900 {
		l, err := e.Broker.List(context.Background(), zclaim.StateScheduled, zclaim.ListOptions{After: after, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		after = l.Next
	}
	const delivered, parsed = 300 * time.Millisecond, time.Second
	for _, start := range []string{"/s/0/scheduled", "/s/0/scheduled?after=" + urlEscape(after)} {
		run(t, ctx, chromedp.Navigate(e.URL+start), chromedp.WaitVisible("#jobs", chromedp.ByQuery))
		var worst [2]time.Duration
		for p := range 10 {
			var first string
			run(t, ctx, chromedp.Text("#jobs tbody tr td.id", &first, chromedp.ByQuery))
			// The best of up to five loads: the machine is shared, and a
			// page's own cost is what is measured.
			var best [2]time.Duration // delivered, parsed
			for try := 0; try < 5; try++ {
				if try > 0 {
					run(t, ctx, chromedp.Reload(), chromedp.WaitVisible("#jobs", chromedp.ByQuery))
				}
				var ms []float64
				run(t, ctx, chromedp.Evaluate(`(() => { const n = performance.getEntriesByType("navigation")[0];
					return [n.responseEnd - n.requestStart, n.domContentLoadedEventEnd - n.startTime]; })()`, &ms))
				for k := range best {
					if got := time.Duration(ms[k] * float64(time.Millisecond)); try == 0 || got < best[k] {
						best[k] = got
					}
				}
				if best[0] < delivered && best[1] < parsed {
					break
				}
			}
			for k := range worst {
				worst[k] = max(worst[k], best[k])
			}
			if best[0] > delivered || best[1] > parsed {
				t.Errorf("page %d from %s (first job %s): delivered in %v (bound %v), parsed in %v (bound %v), at best of five loads",
					p, start, first, best[0], delivered, best[1], parsed)
			}
			if p < 9 {
				// Follow the next link by navigating to it, which waits
				// for the new page's load: a click returns at once, and
				// the old page's #jobs would satisfy the wait until the
				// new one replaced it under the next query.
				var next string
				run(t, ctx, chromedp.JavascriptAttribute("#next", "href", &next, chromedp.ByQuery))
				run(t, ctx, chromedp.Navigate(next), chromedp.WaitVisible("#jobs", chromedp.ByQuery))
			}
		}
		t.Logf("10 pages from %s: the slowest delivered in %v, parsed in %v", start, worst[0], worst[1])
	}
	var first string
	run(t, ctx, chromedp.Text("#jobs tbody tr td.id", &first, chromedp.ByQuery))
	if first != "job-90900" {
		t.Fatalf("the 10th page from 90,000 begins with %s, want job-90900", first)
	}
}

// The search box finds a job by id.
func TestSearch(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{})
	e.Seed(t, 10)
	var id, state string
	run(t, ctx, chromedp.Navigate(e.URL+"/"),
		chromedp.SendKeys("#search-id", "job-7", chromedp.ByQuery),
		chromedp.Submit("#search-id", chromedp.ByQuery),
		chromedp.WaitVisible("#job-id", chromedp.ByQuery),
		chromedp.Text("#job-id", &id, chromedp.ByQuery),
		chromedp.AttributeValue("section.entry", "data-state", &state, nil, chromedp.ByQuery))
	if id != "job-7" || state != "scheduled" {
		t.Fatalf("search shows job %q in state %q", id, state)
	}
}

// Revive a dead job from the dead list: select, confirm, and it is
// scheduled.
func TestRevive(t *testing.T) {
	t.Parallel()
	ctx, dialogs := tab(t)
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	e.Kill(t, "dead-2", "boom")
	var ids, flash string
	run(t, ctx, chromedp.Navigate(e.URL+"/s/0/dead"),
		chromedp.Click(`input[value="dead-1"]`, chromedp.ByQuery),
		chromedp.Click("#act-revive", chromedp.ByQuery),
		chromedp.WaitVisible("#confirm", chromedp.ByQuery),
		chromedp.Text("#confirm-ids", &ids, chromedp.ByQuery))
	if strings.TrimSpace(ids) != "dead-1" {
		t.Fatalf("the confirmation lists %q", ids)
	}
	if j, _ := e.Broker.Job(context.Background(), "dead-1"); j.State != zclaim.StateDead {
		t.Fatalf("revived before the confirmation: %v", j.State)
	}
	run(t, ctx, chromedp.Click("#confirm", chromedp.ByQuery),
		chromedp.WaitVisible("#flash", chromedp.ByQuery),
		chromedp.Text("#flash", &flash, chromedp.ByQuery))
	if !strings.Contains(flash, "Revive: 1 of 1") {
		t.Fatalf("after confirming: %q", flash)
	}
	if j, err := e.Broker.Job(context.Background(), "dead-1"); err != nil || j.State != zclaim.StateScheduled {
		t.Fatalf("dead-1 after the revive: %+v %v", j, err)
	}
	var state string
	run(t, ctx, chromedp.Navigate(e.URL+"/s/0/job?id=dead-1"),
		chromedp.AttributeValue("section.entry", "data-state", &state, nil, chromedp.ByQuery))
	if state != "scheduled" || dialogs.Load() != 0 {
		t.Fatalf("the job page shows %q (%d dialogs)", state, dialogs.Load())
	}
	if j, _ := e.Broker.Job(context.Background(), "dead-2"); j.State != zclaim.StateDead {
		t.Fatalf("dead-2, not selected, is %v", j.State)
	}
}

// A POST without the CSRF token is refused, from the page's own origin
// too; a read-only console shows no buttons and refuses the POST that
// carries the token.
func TestRefusals(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	post := `(async () => (await fetch(document.body.dataset.stats.replace(/api\/stats$/, "s/0/act"),
		{method: "POST", body: new URLSearchParams(%s)})).status)()`
	var status int
	run(t, ctx, chromedp.Navigate(e.URL+"/s/0/dead"),
		chromedp.Evaluate(fmt.Sprintf(post, `{op: "revive", id: "dead-1", confirm: "yes"}`), &status,
			awaitPromise))
	if status != 403 {
		t.Fatalf("POST without the token: %d, want 403", status)
	}
	run(t, ctx, chromedp.Evaluate(fmt.Sprintf(post,
		`{op: "revive", id: "dead-1", confirm: "yes", csrf: document.querySelector("input[name=csrf]").value}`),
		&status, awaitPromise))
	if status != 200 { // the redirect, followed
		t.Fatalf("POST with the token: %d, want 200", status)
	}

	ro := webtest.New(t, webtest.Options{ReadOnly: true})
	ro.Kill(t, "dead-2", "boom")
	var buttons int
	for _, p := range []string{"/", "/s/0/dead", "/s/0/scheduled", "/s/0/job?id=dead-2"} {
		run(t, ctx, chromedp.Navigate(ro.URL+p),
			chromedp.Evaluate(`document.querySelectorAll("button[name=op], input[name=csrf], input[type=checkbox]").length`, &buttons))
		if buttons != 0 {
			t.Fatalf("read-only %s shows %d buttons", p, buttons)
		}
	}
	run(t, ctx, chromedp.Evaluate(fmt.Sprintf(post, `{op: "revive", id: "dead-2", confirm: "yes", csrf: "x"}`),
		&status, awaitPromise))
	if status != 403 {
		t.Fatalf("POST to a read-only console: %d, want 403", status)
	}
	if j, _ := ro.Broker.Job(context.Background(), "dead-2"); j.State != zclaim.StateDead {
		t.Fatalf("dead-2 is %v", j.State)
	}
}

// A page on a name rebound to the console's address (DNS rebinding) gets
// no page and no token, and its script's POST, even with a token read
// elsewhere, changes nothing.
func TestRebound(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	u, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	var tok string
	run(t, ctx, chromedp.Navigate(e.URL+"/s/0/dead"),
		chromedp.Evaluate(`document.querySelector("input[name=csrf]").value`, &tok))
	rebound := "http://rebound.test:" + u.Port() + "/zclaim"
	var text string
	var inputs int
	run(t, ctx, chromedp.Navigate(rebound+"/s/0/dead"), chromedp.Text("body", &text, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll("input").length`, &inputs))
	if inputs != 0 || !strings.Contains(text, "does not answer to the host") || strings.Contains(text, "dead-1") {
		t.Fatalf("the rebound page shows %d inputs:\n%s", inputs, text)
	}
	var status int
	run(t, ctx, chromedp.Evaluate(fmt.Sprintf(`(async () => (await fetch("/zclaim/s/0/act", {method: "POST",
		body: new URLSearchParams({op: "revive", id: "dead-1", confirm: "yes", csrf: %q})})).status)()`, tok),
		&status, awaitPromise))
	if status != 421 {
		t.Fatalf("the rebound page's POST: %d, want 421", status)
	}
	if j, _ := e.Broker.Job(context.Background(), "dead-1"); j.State != zclaim.StateDead {
		t.Fatalf("dead-1 is %v", j.State)
	}
}

// The job page of a job a Dispatcher enqueued shows its asynq task and
// where asynq has it: pending, then in retry with its error; and its
// history as the scripts wrote it, its run's (under the middleware) too.
func TestJobInAsynq(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{BrokerRuns: true})
	queue := "web-" + strings.ReplaceAll(e.Key, ":", "-")
	ac := asynq.NewClientFromRedisClient(e.RDB)
	d, err := zclaim.NewDispatcher(e.Broker, ac, zclaim.DispatcherOptions{
		TaskOptions: func(zclaim.Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} }})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	t.Cleanup(func() { stop(); <-done })
	bg := context.Background()
	if err := e.Broker.Schedule(bg, zclaim.Job{ID: "order-9", RunAt: time.Now().Add(-time.Second), Type: "send"}); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var text string
		run(t, ctx, chromedp.Navigate(e.URL+"/s/0/job?id=order-9"), chromedp.WaitReady("body", chromedp.ByQuery),
			chromedp.Evaluate(`(document.querySelector(".task-state") || {}).textContent || ""`, &text))
		return text
	}
	deadline := time.Now().Add(15 * time.Second)
	for state() != "pending" {
		if time.Now().After(deadline) {
			t.Fatalf("the job page never said pending: %q", state())
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv := asynq.NewServerFromRedisClient(e.RDB, asynq.Config{Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	if err := srv.Start(e.Idem.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return fmt.Errorf("smtp: 451 try later")
	}))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	for state() != "retry" {
		if time.Now().After(deadline) {
			t.Fatalf("the job page never said retry: %q", state())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var text string
	run(t, ctx, chromedp.Text("main", &text, chromedp.ByQuery))
	if !strings.Contains(text, "smtp: 451 try later") || !strings.Contains(text, queue) || !strings.Contains(text, "order-9@") {
		t.Fatalf("the job page:\n%s", text)
	}
	var steps []string
	run(t, ctx, chromedp.Evaluate(`[...document.querySelectorAll("ol.history li")].map(li => li.dataset.what)`, &steps))
	if strings.Join(steps, " ") != "scheduled claimed enqueued started failed" {
		t.Fatalf("the job page's history: %q, want scheduled, claimed, enqueued, started, failed", steps)
	}
	if !regexp.MustCompile(`started: token \d+ on \S+:\d+`).MatchString(text) {
		t.Fatalf("the job page does not say where the run started:\n%s", text)
	}
}

// A job id that is HTML renders as text on every page, and opens no
// dialog.
func TestHostileID(t *testing.T) {
	t.Parallel()
	ctx, dialogs := tab(t)
	e := webtest.New(t, webtest.Options{})
	hostile := `<img src=x onerror=alert(1)>`
	e.Kill(t, hostile, `<script>alert(2)</script>`)
	if err := e.Broker.Schedule(context.Background(), zclaim.Job{ID: hostile, RunAt: time.Now().Add(time.Hour),
		Type: `"><svg onload=alert(3)>`}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/s/0/dead", "/s/0/scheduled", "/s/0/job?id=" + urlEscape(hostile), "/"} {
		var imgs int
		var text string
		run(t, ctx, chromedp.Navigate(e.URL+p), chromedp.WaitReady("body", chromedp.ByQuery),
			chromedp.Sleep(100*time.Millisecond), // time for an onerror to fire
			chromedp.Evaluate(`document.querySelectorAll("main img, main script, main svg[onload]").length`, &imgs),
			chromedp.Text("main", &text, chromedp.ByQuery))
		if imgs != 0 {
			t.Fatalf("%s: the id became %d elements", p, imgs)
		}
		if p != "/" && !strings.Contains(text, hostile) {
			t.Fatalf("%s does not show the id as text:\n%s", p, text)
		}
	}
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

func awaitPromise(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }

var urlEscape = url.QueryEscape

// The overview of a busy schedule, as a PNG: written to the path in
// $ZCLAIM_SCREENSHOT when set (the README's picture is made so:
// ZCLAIM_SCREENSHOT=$PWD/docs/console.png go test -run Screenshot ./zclaimweb/browser).
func TestScreenshot(t *testing.T) {
	t.Parallel()
	ctx, _ := tab(t)
	e := webtest.New(t, webtest.Options{Key: "orders:{reminders}"}) // the only test of this key
	now := time.Now()
	var jobs []zclaim.Job
	for i := range 3000 {
		// Most in the next hour and its morning peak, the rest over the day.
		d := time.Duration(i%60)*time.Minute + time.Duration(i%7)*time.Second
		if i%3 == 0 {
			d = time.Duration(i%24)*time.Hour + 30*time.Minute
		}
		if i%10 == 0 {
			d = time.Duration(5+i%9) * time.Minute
		}
		jobs = append(jobs, zclaim.Job{ID: fmt.Sprintf("order-%d", 7000+i), RunAt: now.Add(d), Type: "order:remind",
			Queue: "default"})
	}
	if err := e.Broker.Schedule(context.Background(), jobs...); err != nil {
		t.Fatal(err)
	}
	e.Kill(t, "order-6917", "attempts exhausted: smtp: 451 try again later")
	e.Kill(t, "order-6923", "attempts exhausted: smtp: 451 try again later")
	c := asynq.NewClientFromRedisClient(e.RDB)
	in := asynq.NewInspectorFromRedisClient(e.RDB)
	for i := range 40 {
		q, id := []string{"default", "critical", "mail"}[i%3], fmt.Sprintf("shot-%d", i)
		if _, err := c.Enqueue(asynq.NewTask("order:remind", nil), asynq.Queue(q), asynq.TaskID(id),
			asynq.Retention(time.Minute)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.DeleteTask(q, id) }) // the next run (go test -count) enqueues them again
	}
	var png []byte
	run(t, ctx, chromedp.EmulateViewport(1100, 760), chromedp.Navigate(e.URL+"/"),
		chromedp.WaitVisible("figure.chart", chromedp.ByQuery), chromedp.FullScreenshot(&png, 100))
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("the screenshot is %d bytes, not a PNG", len(png))
	}
	if path := os.Getenv("ZCLAIM_SCREENSHOT"); path != "" {
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
