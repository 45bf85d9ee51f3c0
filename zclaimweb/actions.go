package zclaimweb

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/zclaim/zclaim"
)

// maxActIDs is the most ids one action takes.
const maxActIDs = zclaim.MaxListLimit

type confirmData struct {
	N     int
	Key   string
	Op    string
	Label string
	IDs   []string
	At    string
	When  time.Time
	Back  string
}

var opLabels = map[string]string{"run-now": "Run now", "cancel": "Cancel", "reschedule": "Reschedule",
	"revive": "Revive", "delete": "Delete for good"}

// act carries out an action on the ids of the form: first a confirmation
// page, then, with confirm=yes, the action and a redirect back to the page
// the form came from.
func (h *handler) act(w http.ResponseWriter, r *http.Request) {
	if h.opts.ReadOnly {
		h.fail(w, r, http.StatusForbidden, "the console is read-only", nil)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "unreadable form", nil)
		return
	}
	if !h.csrfOK(r) {
		h.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again", nil)
		return
	}
	n, b, ok := h.schedule(w, r)
	if !ok {
		return
	}
	op := r.PostFormValue("op")
	label, known := opLabels[op]
	if !known {
		h.fail(w, r, http.StatusBadRequest, "no such action", nil)
		return
	}
	var ids []string
	for _, id := range r.PostForm["id"] {
		if why := badID(id); why != "" {
			h.fail(w, r, http.StatusBadRequest, why, nil)
			return
		}
		if id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 || len(ids) > maxActIDs {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("select 1 to %d jobs", maxActIDs), nil)
		return
	}
	back := r.PostFormValue("back")
	if !strings.HasPrefix(back, "/s/") && back != "/" {
		back = "/"
	}
	d := confirmData{N: n, Key: b.Key(), Op: op, Label: label, IDs: ids, At: r.PostFormValue("at"), Back: back}
	if op == "reschedule" {
		at, err := parseAt(d.At, time.Now())
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, err.Error(), nil)
			return
		}
		d.When = at
	}
	if r.PostFormValue("confirm") != "yes" {
		h.render(w, r, http.StatusOK, "confirm", "Confirm", d)
		return
	}
	ctx := r.Context()
	var done int
	var err error
	switch op {
	case "run-now":
		done, err = b.RunNow(ctx, ids...)
	case "cancel":
		done, err = b.CancelMany(ctx, ids...)
	case "reschedule":
		done, err = b.Reschedule(ctx, d.When, ids...)
	case "revive":
		done, err = b.Revive(ctx, ids...)
	case "delete":
		done, err = b.DeleteDead(ctx, ids...)
	}
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, strings.ToLower(label), err)
		return
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	q := url.Values{"done": {op}, "n": {strconv.Itoa(done)}, "of": {strconv.Itoa(len(ids))}}
	http.Redirect(w, r, h.opts.Root+back+sep+q.Encode(), http.StatusSeeOther)
}

// flash is the message of the action a redirect names (act: done=op,
// n=jobs changed, of=jobs selected), as "Revive: 1 of 1 jobs". The query
// carries no text of its own, so a link cannot make a page say anything
// else; one that names no action, or impossible counts, shows none.
func flash(q url.Values) string {
	label, ok := opLabels[q.Get("done")]
	n, err1 := strconv.Atoi(q.Get("n"))
	of, err2 := strconv.Atoi(q.Get("of"))
	if !ok || err1 != nil || err2 != nil || n < 0 || n > of || of < 1 || of > maxActIDs {
		return ""
	}
	return fmt.Sprintf("%s: %d of %d jobs", label, n, of)
}

// parseAt reads a reschedule's time: a duration from now ("10m", "2h") or
// an RFC 3339 time.
func parseAt(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("reschedule to when? give a duration from now (10m, 2h) or an RFC 3339 time, not %q", s)
}
