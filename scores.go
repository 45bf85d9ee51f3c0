package zclaim

// Scores and times: a due time as a score, and back, to the millisecond,
// saturating where a score holds more than a time.

import (
	"math"
	"strconv"
	"time"
)

// units are a schedule's score units: ups a second, 1 (Unix seconds, with
// a fraction) or 1000 (Unix ms).
type units struct{ ups int }

// score encodes t as a score, rounded up to the millisecond so that a job
// never comes due before t. (Not from UnixNano, which wraps after 2262: a
// year-9999 "never" would come due at once.)
func (b units) score(t time.Time) string {
	ms := t.UnixMilli() // rounded down, before 1970 too
	if t.Nanosecond()%1e6 > 0 {
		ms++
	}
	if b.ups == 1000 {
		return strconv.FormatInt(ms, 10)
	}
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
}

// scoreTime decodes a score (as Redis formats it) to a time. A score
// further out than a time.Time of Unix µs holds (±292,000 years; +inf,
// -inf) saturates to the furthest one.
func (b units) scoreTime(s string) time.Time {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return time.Time{}
	}
	us := f * float64(1e6/b.ups)
	switch {
	case us >= math.MaxInt64: // 2^63 as a float64
		return time.UnixMicro(math.MaxInt64)
	case us <= math.MinInt64:
		return time.UnixMicro(math.MinInt64)
	}
	return time.UnixMicro(int64(math.Round(us)))
}

// maxScoreMs bounds the times a score holds to the millisecond: 100,000
// years either side of 1970. A score in seconds with a fraction is a
// double, whose spacing passes half a millisecond at 2^42 s (139,000 years).
const maxScoreMs = 100_000 * 36525 * 24 * 3600 * 1000 / 100

// inScoreRange reports whether t is within maxScoreMs of 1970 (checked in
// seconds first: UnixMilli wraps for times beyond ±292 million years).
func inScoreRange(t time.Time) bool {
	s := t.Unix()
	return s > -maxScoreMs/1000 && s < maxScoreMs/1000
}

// seconds converts a span in seconds to a Duration, saturating instead of
// wrapping beyond ±292 years.
func seconds(s float64) time.Duration {
	d := s * float64(time.Second)
	switch {
	case d >= math.MaxInt64:
		return math.MaxInt64
	case d <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(d)
}

// dueTime decodes an occurrence's due score to the nearest millisecond,
// saturating as scoreTime does.
func (b units) dueTime(s string) time.Time {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return time.Time{}
	}
	ms := math.Round(f * float64(1000/b.ups))
	switch {
	case ms >= math.MaxInt64/1000:
		return time.UnixMicro(math.MaxInt64)
	case ms <= math.MinInt64/1000:
		return time.UnixMicro(math.MinInt64)
	}
	return time.UnixMilli(int64(ms))
}

// ms rounds d up to whole milliseconds, at least 1; unlike adding 999µs
// first, it does not wrap around near the largest Duration.
func ms(d time.Duration) int64 {
	m := d.Milliseconds()
	if d%time.Millisecond > 0 {
		m++
	}
	return max(1, m)
}

func max0(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}
