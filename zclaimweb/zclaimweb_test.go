package zclaimweb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimweb"
	"github.com/zclaim/zclaim/zclaimweb/internal/webtest"
)

var ctx = context.Background()

func TestMain(m *testing.M) {
	if err := webtest.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	webtest.Redis.Close()
	os.Exit(code)
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := noRedirect.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, u string, form url.Values, header ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("POST", u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func csrf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// The overview shows the schedule's counts, its due charts and asynq's
// queues, and api/stats the same counts as JSON.
func TestOverview(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{Shards: 2})
	e.Seed(t, 120)
	e.Kill(t, "gone-1", "attempts exhausted")
	code, body := get(t, e.URL+"/")
	if code != 200 {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	for _, want := range []string{`id="s0-scheduled">120<`, `id="s0-dead">1<`, `id="s0-inflight">0<`,
		"due in the next hour: 0 jobs", "due in the next day: 120 jobs", "asynq queues"} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	code, body = get(t, e.URL+"/api/stats")
	var st struct {
		Schedules []struct {
			Key             string
			Scheduled, Dead int64
		}
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || len(st.Schedules) != 1 ||
		st.Schedules[0].Scheduled != 120 || st.Schedules[0].Dead != 1 || st.Schedules[0].Key != e.Key {
		t.Fatalf("api/stats: %d %v %s", code, err, body)
	}
	if code, _ := get(t, strings.TrimSuffix(e.URL, "/zclaim")+"/"); code != 404 {
		t.Errorf("a path outside the mount point: %d, want 404", code)
	}
}

// A listing pages through the schedule with the lookup API's cursors:
// every job once, in due order.
func TestPaging(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{PageSize: 40})
	e.Seed(t, 100)
	idRe := regexp.MustCompile(`<td class="id"><a href="[^"]*">(job-\d+)</a>`)
	nextRe := regexp.MustCompile(`href="([^"]*)" id="next"`)
	var seen []string
	u := e.URL + "/s/0/scheduled"
	for pages := 0; u != ""; pages++ {
		if pages > 3 {
			t.Fatal("more than 3 pages of 40 for 100 jobs")
		}
		code, body := get(t, u)
		if code != 200 {
			t.Fatalf("%s: %d", u, code)
		}
		for _, m := range idRe.FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		u = ""
		if m := nextRe.FindStringSubmatch(body); m != nil {
			u = strings.TrimSuffix(e.URL, "/zclaim") + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 100 {
		t.Fatalf("saw %d jobs, want 100", len(seen))
	}
	for i, id := range seen {
		if id != fmt.Sprintf("job-%d", i) {
			t.Fatalf("job %d on the pages is %s", i, id)
		}
	}
}

// Revive through the confirmation page: the first POST changes nothing,
// the confirmed one revives and redirects back with a message.
func TestReviveConfirmed(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	_, page := get(t, e.URL+"/s/0/dead")
	form := url.Values{"csrf": {csrf(t, page)}, "op": {"revive"}, "id": {"dead-1"}, "back": {"/s/0/dead"}}
	code, body, _ := post(t, e.URL+"/s/0/act", form)
	if code != 200 || !strings.Contains(body, `id="confirm"`) {
		t.Fatalf("first POST: %d, want the confirmation page:\n%s", code, body)
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("before confirming: %+v %v", j, err)
	}
	form.Set("confirm", "yes")
	// As a browser posts a form under Referrer-Policy no-referrer.
	code, _, hd := post(t, e.URL+"/s/0/act", form, "Origin", "null", "Sec-Fetch-Site", "same-origin")
	if code != http.StatusSeeOther || !strings.HasPrefix(hd.Get("Location"), "/zclaim/s/0/dead?done=") {
		t.Fatalf("confirmed POST: %d to %q", code, hd.Get("Location"))
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateScheduled {
		t.Fatalf("after reviving: %+v %v", j, err)
	}
	loc, err := url.Parse(hd.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	if _, page := get(t, e.URL+strings.TrimPrefix(loc.RequestURI(), "/zclaim")); !strings.Contains(page,
		`<p class="flash" id="flash">Revive: 1 of 1 jobs</p>`) {
		t.Fatalf("the page the POST redirected to (%s) shows no message of the revive:\n%s", loc, page)
	}
}

// A page shows the message of the action its query names, and nothing a
// link writes into the query: no text of its own, no impossible counts.
func TestFlashNamesActionsOnly(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	for q, want := range map[string]string{
		"done=delete&n=2&of=3":                     "Delete for good: 2 of 3 jobs",
		"done=Redis+is+down%3A+run+this+to+fix+it": "",
		"done=revive&n=4&of=3":                     "",
		"done=revive&n=-1&of=3":                    "",
		"done=revive&n=0&of=0":                     "",
		"done=revive&n=1":                          "",
		"done=nuke&n=1&of=1":                       "",
	} {
		_, page := get(t, e.URL+"/s/0/dead?"+q)
		got := ""
		if m := regexp.MustCompile(`<p class="flash" id="flash">([^<]*)</p>`).FindStringSubmatch(page); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("?%s: the page says %q, want %q", q, got, want)
		}
	}
}

// Every action, confirmed, does what it says on a scheduled job.
func TestActions(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	e.Seed(t, 3)
	_, page := get(t, e.URL+"/s/0/scheduled")
	tok := csrf(t, page)
	act := func(op, id string, extra ...string) {
		t.Helper()
		form := url.Values{"csrf": {tok}, "op": {op}, "id": {id}, "back": {"/s/0/scheduled"}, "confirm": {"yes"}}
		for i := 0; i+1 < len(extra); i += 2 {
			form.Set(extra[i], extra[i+1])
		}
		if code, body, _ := post(t, e.URL+"/s/0/act", form); code != http.StatusSeeOther {
			t.Fatalf("%s %s: %d\n%s", op, id, code, body)
		}
	}
	act("run-now", "job-0")
	if st, _ := e.Broker.Stats(ctx); st.Due != 1 {
		t.Fatalf("after run-now: %d due, want 1", st.Due)
	}
	act("reschedule", "job-1", "at", "72h")
	if j, _ := e.Broker.Job(ctx, "job-1"); time.Until(j.RunAt) < 71*time.Hour || time.Until(j.RunAt) > 73*time.Hour {
		t.Fatalf("after rescheduling to 72h from now: runs at %v", j.RunAt)
	}
	act("cancel", "job-2")
	if _, err := e.Broker.Job(ctx, "job-2"); !errors.Is(err, zclaim.ErrNotFound) {
		t.Fatalf("after cancel: %v", err)
	}
	e.Kill(t, "d", "boom")
	act("delete", "d")
	if _, err := e.Broker.Job(ctx, "d"); !errors.Is(err, zclaim.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	form := url.Values{"csrf": {tok}, "op": {"reschedule"}, "id": {"job-1"}, "at": {"soon"}}
	if code, _, _ := post(t, e.URL+"/s/0/act", form); code != http.StatusBadRequest {
		t.Fatalf("reschedule to \"soon\": %d, want 400", code)
	}
}

// A POST without the CSRF token, with a wrong one, or from another site is
// refused and changes nothing; a read-only console shows no buttons and
// refuses every POST.
func TestRefused(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	_, page := get(t, e.URL+"/s/0/dead")
	tok := csrf(t, page)
	base := url.Values{"op": {"revive"}, "id": {"dead-1"}, "confirm": {"yes"}}
	for name, c := range map[string]struct {
		tok    string
		header []string
	}{
		"no token":    {"", nil},
		"wrong token": {strings.Repeat("0", len(tok)), nil},
		"other site":  {tok, []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		"null origin": {tok, []string{"Origin", "null"}},
	} {
		form := url.Values{}
		for k, v := range base {
			form[k] = v
		}
		if c.tok != "" {
			form.Set("csrf", c.tok)
		}
		if code, _, _ := post(t, e.URL+"/s/0/act", form, c.header...); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("after refused POSTs: %+v %v", j, err)
	}

	ro := webtest.New(t, webtest.Options{ReadOnly: true})
	ro.Kill(t, "dead-2", "boom")
	for _, p := range []string{"/", "/s/0/dead", "/s/0/job?id=dead-2"} {
		_, body := get(t, ro.URL+p)
		if strings.Contains(body, "<button type=\"submit\" name=\"op\"") || strings.Contains(body, `name="csrf"`) {
			t.Errorf("read-only %s shows an action", p)
		}
	}
	form := url.Values{"csrf": {tok}, "op": {"revive"}, "id": {"dead-2"}, "confirm": {"yes"}}
	if code, _, _ := post(t, ro.URL+"/s/0/act", form); code != http.StatusForbidden {
		t.Fatalf("read-only POST: %d, want 403", code)
	}
	if j, err := ro.Broker.Job(ctx, "dead-2"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("after a read-only POST: %+v %v", j, err)
	}
}

// Ids, types and reasons from Redis are text: a hostile id is escaped on
// every page it appears on; the pages forbid inline script.
func TestEscaped(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	hostile := `<img src=x onerror=alert(1)>`
	e.Kill(t, hostile, `<script>alert(2)</script>`)
	if err := e.Broker.Schedule(ctx, zclaim.Job{ID: hostile + "2", RunAt: time.Now().Add(time.Hour), Type: `"><b>t`}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/s/0/dead", "/s/0/scheduled", "/s/0/job?id=" + url.QueryEscape(hostile)} {
		code, body := get(t, e.URL+p)
		if code != 200 {
			t.Fatalf("%s: %d", p, code)
		}
		for _, bad := range []string{"<img", "<script>alert", "<b>t"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s holds %q unescaped", p, bad)
			}
		}
		if !strings.Contains(body, "&lt;img src=x onerror=alert(1)&gt;") {
			t.Errorf("%s does not show the hostile id as text", p)
		}
	}
	resp, err := http.Get(e.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
}

// The job page shows every entry of an id; an unknown id is a 404 page.
func TestJobPage(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	e.Seed(t, 1)
	code, body := get(t, e.URL+"/s/0/job?id=job-0")
	if code != 200 || !strings.Contains(body, `data-state="scheduled"`) || !strings.Contains(body, "email") {
		t.Fatalf("job page: %d\n%s", code, body)
	}
	// A job whose record does not decode: the listing says so in its row,
	// the job page gives the error.
	pending := e.Key + ":jobs"
	if !strings.Contains(e.Key, "{") {
		pending = "{" + e.Key + "}:jobs"
	}
	if err := e.Broker.Schedule(ctx, zclaim.Job{ID: "junk", RunAt: time.Now().Add(time.Hour), Type: "email"}); err != nil {
		t.Fatal(err)
	}
	if err := e.RDB.HSet(ctx, pending, "junk", "junk").Err(); err != nil {
		t.Fatal(err)
	}
	code, body = get(t, e.URL+"/s/0/scheduled")
	if want := `<span class="error" title="zclaim: job &#34;junk&#34;: `; code != 200 || !strings.Contains(body, want) ||
		strings.Count(body, "record cannot be read") != 1 {
		t.Fatalf("listing: %d, want one %s in\n%s", code, want, body)
	}
	if code, body = get(t, e.URL+"/s/0/job?id=junk"); code != 200 || !strings.Contains(body, `<dt>record</dt><dd class="error">zclaim: job &#34;junk&#34;: `) {
		t.Fatalf("job page of junk: %d\n%s", code, body)
	}
	if code, body := get(t, e.URL+"/s/0/job?id=nope"); code != 404 || !strings.Contains(body, `id="not-found"`) {
		t.Fatalf("unknown id: %d", code)
	}
	if code, _ := get(t, e.URL+"/job?id=job-0"); code != http.StatusSeeOther {
		t.Fatalf("search box: %d, want a redirect", code)
	}
	for _, p := range []string{"/s/9/scheduled", "/s/x/dead", "/s/0/nothing", "/s/01/dead"} {
		if code, _ := get(t, e.URL+p); code != 404 {
			t.Errorf("%s: %d, want 404", p, code)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	for name, o := range map[string]zclaimweb.Options{
		"no schedule": {},
		"nil broker":  {Schedules: []*zclaim.Broker{nil}},
		"root":        {Schedules: []*zclaim.Broker{e.Broker}, Root: "zclaim"},
		"page size":   {Schedules: []*zclaim.Broker{e.Broker}, PageSize: zclaim.MaxListLimit + 1},
		"refresh":     {Schedules: []*zclaim.Broker{e.Broker}, Refresh: 1},
	} {
		if _, err := zclaimweb.New(o); !errors.Is(err, zclaimweb.ErrInvalidOptions) {
			t.Errorf("%s: %v, want ErrInvalidOptions", name, err)
		}
	}
}

// The runs page shows the run of each active asynq task: live (its lease
// renewed), abandoned (its worker is gone), or no record; the periodic page
// a schedule's definitions; the queues page asynq's queues and their
// counts. Before there is anything, each says so.
func TestRunsPeriodicQueues(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	for _, p := range []string{"/runs", "/s/0/periodic"} {
		if code, page := get(t, e.URL+p); code != http.StatusOK || !strings.Contains(page, ">none</td>") {
			t.Fatalf("%s with nothing to show: %d\n%s", p, code, page)
		}
	}
	q := "web-" + strings.ReplaceAll(e.Key, ":", "-")
	// A worker without the middleware holds its tasks active.
	started, release := make(chan string, 3), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(e.RDB, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 3,
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(release); srv.Shutdown() })
	c := asynq.NewClientFromRedisClient(e.RDB)
	for _, id := range []string{"live-run", "dead-run", "no-run"} {
		if _, err := c.Enqueue(asynq.NewTask("email", nil), asynq.Queue(q), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatalf("task %s did not start", id)
		}
	}
	if _, err := e.Idem.Begin(ctx, "live-run"); err != nil {
		t.Fatal(err)
	}
	dead, err := zclaim.NewIdempotency(e.RDB, zclaim.IdempotencyOptions{Prefix: e.Idem.Prefix(), Lease: 20 * time.Millisecond,
		DisableTakeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Begin(ctx, "dead-run"); err != nil { // and then its worker died
		t.Fatal(err)
	}
	time.Sleep(40 * time.Millisecond)
	code, page := get(t, e.URL+"/runs")
	for _, want := range []string{`<tr data-state="running"><td class="id">live-run</td>`,
		`<tr data-state="abandoned"><td class="id">dead-run</td>`, `<tr data-state="no record"><td class="id">no-run</td>`} {
		if code != http.StatusOK || !strings.Contains(page, want) {
			t.Fatalf("runs: %d, no %s in\n%s", code, want, page)
		}
	}
	if err := e.Broker.SetPeriodic(ctx, zclaim.Periodic{Name: "report", Spec: "@every 1h", Type: "report"}); err != nil {
		t.Fatal(err)
	}
	code, page = get(t, e.URL+"/s/0/periodic")
	if want := `<td class="id">report</td><td>@every 1h</td>`; code != http.StatusOK || !strings.Contains(page, want) {
		t.Fatalf("periodic: %d, no %s in\n%s", code, want, page)
	}
	// A definition whose time zone does not load here is listed with why.
	defs := e.Key + ":periodic" // the key has a hash tag: its keys keep it
	js, err := e.RDB.HGet(ctx, defs, "report").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RDB.HSet(ctx, defs, "report", strings.Replace(js, `"tz":"UTC"`, `"tz":"Nowhere/Atlantis"`, 1)).Err(); err != nil {
		t.Fatal(err)
	}
	code, page = get(t, e.URL+"/s/0/periodic")
	if want := `<td class="id">report</td><td>@every 1h</td><td><span class="error">cannot be read here: zclaim: corrupt value: periodic &#34;report&#34;: time zone &#34;Nowhere/Atlantis&#34; does not load`; code != http.StatusOK || !strings.Contains(page, want) {
		t.Fatalf("periodic, a definition that cannot be read: %d, no %s in\n%s", code, want, page)
	}
	code, page = get(t, e.URL+"/queues")
	if want := "<tr><td>" + q + "</td><td>3</td><td>0</td><td>3</td>"; code != http.StatusOK || !strings.Contains(page, want) {
		t.Fatalf("queues: %d, no %s in\n%s", code, want, page)
	}
}

// A queue whose keys are of another type than asynq's is listed with why,
// on the queues page and the overview, and every other queue with its
// counts.
func TestHostileQueue(t *testing.T) {
	t.Parallel()
	addr := ownRedis(t)
	e := webtest.New(t, webtest.Options{Addr: addr, BrokerRuns: true})
	if _, err := asynq.NewClientFromRedisClient(e.RDB).Enqueue(asynq.NewTask("email", nil), asynq.Queue("fine")); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"bad", "zzz"} { // sorted before and after the sound one
		if err := e.RDB.SAdd(ctx, "asynq:queues", q).Err(); err != nil {
			t.Fatal(err)
		}
		for _, part := range []string{"pending", "active"} {
			if err := e.RDB.Set(ctx, "asynq:{"+q+"}:"+part, "junk", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []string{"/queues", "/"} {
		code, page := get(t, e.URL+p)
		for _, want := range []string{`<tr><td>bad</td><td colspan="8"><span class="error">cannot be read: `,
			"<tr><td>fine</td><td>1</td><td>1</td>", `<tr><td>zzz</td><td colspan="8"><span class="error">cannot be read: `} {
			if code != http.StatusOK || !strings.Contains(page, want) {
				t.Fatalf("%s: %d, no %s in\n%s", p, code, want, page)
			}
		}
	}
	// The runs page lists the runs of the queues it can read, and names
	// each it cannot.
	code, page := get(t, e.URL+"/runs")
	for _, q := range []string{"bad", "zzz"} {
		if want := `<p class="error">zclaim: asynq queue &#34;` + q + `&#34; cannot be read: `; code != http.StatusOK || !strings.Contains(page, want) {
			t.Fatalf("/runs: %d, no %s in\n%s", code, want, page)
		}
	}
	// The job page of a Broker made with Runs shows the job, and the
	// queues whose runs it could not read.
	if err := e.Broker.Schedule(ctx, zclaim.Job{ID: "later", RunAt: time.Now().Add(time.Hour), Type: "email"}); err != nil {
		t.Fatal(err)
	}
	code, page = get(t, e.URL+"/s/0/job?id=later")
	if want := `<p class="error">zclaim: asynq queue &#34;zzz&#34; cannot be read: `; code != http.StatusOK ||
		!strings.Contains(page, `data-state="scheduled"`) || !strings.Contains(page, want) {
		t.Fatalf("job page: %d, want the job and %s in\n%s", code, want, page)
	}
}

// asynq's queues are read a page at a time (PageSize), by name: each
// costs the Inspector round trips of its own.
func TestQueuePages(t *testing.T) {
	t.Parallel()
	addr := ownRedis(t)
	e := webtest.New(t, webtest.Options{Addr: addr, PageSize: 2})
	for _, q := range []string{"q5", "q3", "q1", "q4", "q2"} {
		if err := e.RDB.SAdd(ctx, "asynq:queues", q).Err(); err != nil {
			t.Fatal(err)
		}
	}
	row := regexp.MustCompile(`<tr><td>(q\d)</td>`)
	for _, c := range []struct{ path, rows, next string }{
		{"/queues", "q1 q2", "q2"},
		{"/queues?after=q2", "q3 q4", "q4"},
		{"/queues?after=q4", "q5", ""},
		{"/", "q1 q2", "q2"},
	} {
		code, page := get(t, e.URL+c.path)
		var names []string
		for _, m := range row.FindAllStringSubmatch(page, -1) {
			names = append(names, m[1])
		}
		next := regexp.MustCompile(`id="queues-next"`).MatchString(page)
		if code != http.StatusOK || strings.Join(names, " ") != c.rows || next != (c.next != "") ||
			c.next != "" && !strings.Contains(page, `/queues?after=`+c.next+`"`) {
			t.Fatalf("%s: %d, queues %v, next link %v; want %s and a next page after %q\n%s", c.path, code, names, next, c.rows, c.next, page)
		}
	}
}

// The job page shows each run of the job's active asynq tasks once: in a
// table of its own, or, when the schedule's Broker reports the console's
// runs itself, among the job's entries. Either way the job page and the
// overview read the runs once.
func TestJobPageRuns(t *testing.T) {
	t.Parallel()
	addr := ownRedis(t)
	q := "webjob"
	tid := q + "-task" // its run is keyed by the task id: the job of that id
	started, release := make(chan struct{}, 1), make(chan struct{})
	ardb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { ardb.Close() })
	asrv := asynq.NewServerFromRedisClient(ardb, asynq.Config{Queues: map[string]int{q: 1}, TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	if err := asrv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		started <- struct{}{}
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(release); asrv.Shutdown() })
	for _, brokerRuns := range []bool{false, true} {
		e := webtest.New(t, webtest.Options{Addr: addr, BrokerRuns: brokerRuns})
		if !brokerRuns { // once
			if _, err := asynq.NewClientFromRedisClient(e.RDB).Enqueue(asynq.NewTask("email", nil), asynq.Queue(q), asynq.TaskID(tid)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("the task did not start")
			}
		}
		if _, err := e.Idem.Begin(ctx, tid); err != nil { // each console's store has a live run of it
			t.Fatal(err)
		}
		reads := &queueReads{}
		e.RDB.AddHook(reads)
		code, page := get(t, e.URL+"/s/0/job?id="+tid)
		table := strings.Contains(page, `<tr data-state="running"><td class="id">`+tid+`</td>`)
		entry := strings.Contains(page, `<section class="entry" data-state="running">`)
		if code != http.StatusOK || strings.Count(page, `data-state="running"`) != 1 || table == brokerRuns || entry != brokerRuns {
			t.Fatalf("Broker with Runs %v: job page %d, run in a table %v, as an entry %v; want it once, as an entry only with Runs\n%s",
				brokerRuns, code, table, entry, page)
		}
		if n := reads.n.Swap(0); n != 1 {
			t.Errorf("Broker with Runs %v: the job page listed asynq's queues %d times, want 1", brokerRuns, n)
		}
		// Either way the page gives the run's lease and token.
		for _, want := range []string{"<dt>lease until</dt>", "<dt>token</dt>"} {
			if brokerRuns && !strings.Contains(page, want) {
				t.Errorf("job page, the run as an entry: no %s in\n%s", want, page)
			}
		}
		if code, _ := get(t, e.URL+"/"); code != http.StatusOK {
			t.Fatalf("overview: %d", code)
		}
		if n := reads.n.Swap(0); n != 2 { // the runs, and the queues' table
			t.Errorf("Broker with Runs %v: the overview listed asynq's queues %d times, want 2", brokerRuns, n)
		}
	}
}

// ownRedis starts a Redis server for t alone, and returns its address:
// asynq lists its queues and their active tasks server-wide, so a test
// that counts them cannot share a server.
func ownRedis(t *testing.T) string {
	t.Helper()
	srv, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv.Addr
}

// queueReads counts the SMEMBERS of asynq's queues: one for each reading
// of the runs of active tasks, and one for the overview's queues.
type queueReads struct{ n atomic.Int64 }

func (h *queueReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *queueReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) == 2 && strings.EqualFold(fmt.Sprint(a[0]), "smembers") && a[1] == "asynq:queues" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *queueReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
