package zclaim

// How zclaim logs: the logger of options that name none, a warning logged
// once per cause and period, and an id cut short for a log line.

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// discardLogger is the logger of options that name none.
var discardLogger = slog.New(slog.DiscardHandler)

// claimWarnEvery is how often a claim failure of one cause is logged.
const claimWarnEvery = 10 * time.Second

// rateLog logs a warning once per cause per claimWarnEvery, with how many
// of that cause went unlogged since.
type rateLog struct {
	mu    sync.Mutex
	last  map[string]time.Time
	quiet map[string]int
}

func (r *rateLog) warn(ctx context.Context, log *slog.Logger, cause, msg string, attrs ...slog.Attr) {
	r.mu.Lock()
	if r.last == nil {
		r.last, r.quiet = map[string]time.Time{}, map[string]int{}
	}
	if len(cause) > 200 {
		cause = cause[:200]
	}
	if time.Since(r.last[cause]) < claimWarnEvery {
		r.quiet[cause]++
		r.mu.Unlock()
		return
	}
	n := r.quiet[cause]
	r.last[cause], r.quiet[cause] = time.Now(), 0
	if len(r.last) > 100 { // causes that vary without end: start over
		clear(r.last)
		r.last[cause] = time.Now()
	}
	r.mu.Unlock()
	log.LogAttrs(ctx, slog.LevelWarn, msg, append(attrs, slog.Int("unlogged_since", n))...)
}

// short cuts an id for a log line: at most about 200 bytes.
func short(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:180] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
