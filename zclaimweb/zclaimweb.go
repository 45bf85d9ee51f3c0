// Package zclaimweb is a web console for zclaim schedules: an http.Handler
// that shows the schedule, the in-flight and dead jobs, the runs of active
// asynq tasks and the periodic definitions, and runs, reschedules,
// cancels, revives and deletes jobs.
//
// Mount it under a path of its own, behind the service's own auth:
//
//	h, err := zclaimweb.New(zclaimweb.Options{
//		Schedules:   []*zclaim.Broker{broker},
//		Idempotency: idem,                                   // optional: runs
//		Inspector:   asynq.NewInspectorFromRedisClient(rdb), // optional: asynq's queues
//		Root:        "/zclaim",
//		Hosts:       []string{"ops.example.com"},             // the name it is served under
//	})
//	mux.Handle("/zclaim/", h)
//
// It answers only to IP addresses, loopback names and the names in
// Options.Hosts: a page on another name rebound to its address gets 421
// and no token. The pages and their assets are embedded; nothing is
// fetched at run time.
// Every value from Redis is escaped. Actions are POSTs that carry the
// handler's CSRF token and pass through a confirmation page; with ReadOnly
// the pages show no buttons and the handler refuses every POST. The
// handler reads only what a page shows, through the Brokers' lookups (no
// KEYS, no SCAN). docs/console.md describes the pages.
package zclaimweb

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
)

// Options configure the console. The zero value of each field but
// Schedules means its documented default.
type Options struct {
	// Schedules are the schedules the console shows, at least one.
	Schedules []*zclaim.Broker
	// Idempotency, when set, adds the runs of active asynq tasks (live,
	// abandoned by a dead worker, taken over) to the overview, to the job
	// page, and a page of their own. A schedule whose Broker was made
	// with this store as its Runs reports them through the Broker (its
	// Stats and Jobs); the console then reads them once, not twice.
	Idempotency *zclaim.Idempotency
	// Inspector, when set, shows asynq's queues beside the schedules.
	Inspector *asynq.Inspector
	// ReadOnly shows no buttons and refuses every POST.
	ReadOnly bool
	// Root is the path the handler is mounted at, as in "/zclaim".
	// Default: "/".
	Root string
	// PageSize is the number of jobs on a page of a listing, and of asynq
	// queues on a page of theirs, 1 to zclaim.MaxListLimit. Default: 50.
	PageSize int
	// Refresh is how often the pages update their counts. Default: 2s.
	Refresh time.Duration
	// Logger receives the errors the pages show. nil: none are logged.
	Logger *slog.Logger
	// Hosts are the names the console answers to besides loopback names
	// ("localhost", "*.localhost") and IP addresses, as they appear in a
	// request's Host header: "ops.example.com" (any port),
	// "ops.example.com:8443" (that port only), "*.ops.example.com" (any
	// name under it). A request whose Host is none of these gets 421
	// before a page or a token is served: a page on another name that
	// resolves to the console's address (DNS rebinding) cannot read or
	// change anything. Behind a proxy that ends TLS, name the host with
	// its scheme, "https://ops.example.com", so that a form's Origin of
	// https is its own.
	Hosts []string
}

// ErrInvalidOptions is returned by New for options it cannot use.
var ErrInvalidOptions = errors.New("zclaimweb: invalid options")

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

type handler struct {
	opts  Options
	hosts []hostRule
	mux   *http.ServeMux
	pages map[string]*template.Template
	csrf  string // the token every form carries
}

// New returns the console's handler.
func New(opts Options) (http.Handler, error) {
	if len(opts.Schedules) == 0 {
		return nil, fmt.Errorf("%w: no schedule", ErrInvalidOptions)
	}
	for _, b := range opts.Schedules {
		if b == nil {
			return nil, fmt.Errorf("%w: a nil Broker", ErrInvalidOptions)
		}
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	if !strings.HasPrefix(opts.Root, "/") {
		return nil, fmt.Errorf("%w: Root %q does not start with /", ErrInvalidOptions, opts.Root)
	}
	opts.Root = strings.TrimSuffix(opts.Root, "/")
	if opts.PageSize == 0 {
		opts.PageSize = 50
	}
	if opts.PageSize < 1 || opts.PageSize > zclaim.MaxListLimit {
		return nil, fmt.Errorf("%w: PageSize must be between 1 and %d, not %d", ErrInvalidOptions,
			zclaim.MaxListLimit, opts.PageSize)
	}
	if opts.Refresh == 0 {
		opts.Refresh = 2 * time.Second
	}
	if opts.Refresh < 100*time.Millisecond {
		return nil, fmt.Errorf("%w: Refresh must be at least 100ms, not %v", ErrInvalidOptions, opts.Refresh)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	hosts, err := parseHosts(opts.Hosts)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	h := &handler{opts: opts, hosts: hosts, mux: http.NewServeMux(), pages: map[string]*template.Template{},
		csrf: hex.EncodeToString(token)}
	if err := h.parse(); err != nil {
		return nil, err
	}
	assets, _ := fs.Sub(assetFS, "assets")
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /api/stats", h.apiStats)
	h.mux.HandleFunc("GET /s/{s}/{state}", h.list)
	h.mux.HandleFunc("GET /s/{s}/job", h.job)
	h.mux.HandleFunc("GET /job", h.search)
	h.mux.HandleFunc("GET /s/{s}/periodic", h.periodic)
	h.mux.HandleFunc("GET /runs", h.runs)
	h.mux.HandleFunc("GET /queues", h.queues)
	h.mux.HandleFunc("POST /s/{s}/act", h.act)
	return http.StripPrefix(opts.Root, h), nil
}

func (h *handler) parse() error {
	funcs := template.FuncMap{
		"path": func(p string, q ...string) string { return h.path(p, q...) },
		"ago":  ago,
		"abs":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"add":  func(a, b int) int { return a + b },
		"cut":  func(s string) string { return cut(s, maxShownID) },
		"fits": func(id string) bool { return badID(id) == "" },
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return err
		}
		h.pages[strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")] = t
	}
	return nil
}

// path is the URL of p (from the handler's root) with query pairs q.
func (h *handler) path(p string, q ...string) string {
	u := h.opts.Root + p
	if len(q) > 1 {
		v := url.Values{}
		for i := 0; i+1 < len(q); i += 2 {
			if q[i+1] != "" {
				v.Add(q[i], q[i+1])
			}
		}
		if len(v) > 0 {
			u += "?" + v.Encode()
		}
	}
	return u
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	if _, ok := h.origin(r); !ok {
		http.Error(w, "zclaimweb: the console does not answer to the host "+strconv.Quote(cut(r.Host, 100))+
			"; name it in Options.Hosts (zclaim web --host)", http.StatusMisdirectedRequest)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	Title     string
	Root      string
	CSRF      string
	ReadOnly  bool
	Refresh   int64 // ms
	Schedules []scheduleRef
	HasRuns   bool
	HasQueues bool
	Flash     string
	Data      any
}

type scheduleRef struct {
	N   int
	Key string
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Title: title, Root: h.opts.Root, ReadOnly: h.opts.ReadOnly, Refresh: h.opts.Refresh.Milliseconds(),
		HasRuns: h.opts.Idempotency != nil, HasQueues: h.opts.Inspector != nil, Flash: flash(r.URL.Query()),
		Data: data}
	if !h.opts.ReadOnly {
		p.CSRF = h.csrf
	}
	for i, b := range h.opts.Schedules {
		p.Schedules = append(p.Schedules, scheduleRef{i, b.Key()})
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.opts.Logger.Error("zclaimweb: page failed", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "zclaimweb: the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail shows an error page; a Redis or lookup error is logged too.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	if err != nil {
		h.opts.Logger.Error("zclaimweb: "+msg, slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		msg += ": " + err.Error()
	}
	h.render(w, r, status, "error", "Error", msg)
}

// schedule is the Broker the {s} of the request's path names.
func (h *handler) schedule(w http.ResponseWriter, r *http.Request) (int, *zclaim.Broker, bool) {
	n, err := strconv.Atoi(r.PathValue("s"))
	if err != nil || n < 0 || n >= len(h.opts.Schedules) || strconv.Itoa(n) != r.PathValue("s") {
		h.fail(w, r, http.StatusNotFound, "no such schedule", nil)
		return 0, nil, false
	}
	return n, h.opts.Schedules[n], true
}

// sameOrigin refuses a POST that a browser says came from another site:
// its Origin must be the console's own, by scheme, host and port.
func (h *handler) sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	// A browser that withholds the origin sends "null"; Sec-Fetch-Site
	// then has to vouch for the request.
	if o := r.Header.Get("Origin"); o == "null" {
		return r.Header.Get("Sec-Fetch-Site") == "same-origin"
	} else if o != "" {
		own, ok := h.origin(r)
		return ok && sameSite(o, own)
	}
	return true
}

func (h *handler) csrfOK(r *http.Request) bool {
	return subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(h.csrf)) == 1 && h.sameOrigin(r)
}

// maxShownID is the most bytes of an id a page shows in a listing.
const maxShownID = 120

// cut is s cut to at most n bytes, on a character's edge, with an
// ellipsis and the length where it was cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s… (%d bytes)", strings.ToValidUTF8(s[:i], "\uFFFD"), len(s))
}

// badID says why zclaim cannot look up or act on id (longer than
// zclaim.MaxIDLen, or not UTF-8), or "" when it can.
func badID(id string) string {
	switch {
	case len(id) > zclaim.MaxIDLen:
		return fmt.Sprintf("a job id of %d bytes: zclaim handles ids of at most %d", len(id), zclaim.MaxIDLen)
	case !utf8.ValidString(id):
		return "a job id that is not UTF-8: zclaim handles UTF-8 ids only"
	}
	return ""
}

// ago says how far t is from now, as "in 3m" or "5s ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	d := time.Until(t)
	s := "in "
	if d < 0 {
		d, s = -d, ""
	}
	var v string
	switch {
	case d < time.Second:
		v = d.Round(time.Millisecond).String()
	case d < time.Minute:
		v = d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		v = d.Round(time.Second).String()
	case d < 48*time.Hour:
		v = d.Round(time.Minute).String()
	default:
		v = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if s == "" {
		return v + " ago"
	}
	return s + v
}

// search sends the search box's id to its schedule's job page.
func (h *handler) search(w http.ResponseWriter, r *http.Request) {
	s := r.URL.Query().Get("s")
	if s == "" {
		s = "0"
	}
	http.Redirect(w, r, h.path("/s/"+url.PathEscape(s)+"/job", "id", r.URL.Query().Get("id")), http.StatusSeeOther)
}
