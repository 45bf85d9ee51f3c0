package zclaim

import (
	"fmt"
	"strconv"
	"strings"
)

// A record is what the broker keeps beside a job id: how many claims the
// run already had, the score its occurrence was first scheduled at, and
// the job's type, queue and payload. Scripts only read and rewrite the
// "<attempts>@<due>[~<score>]:" prefix (see prelude.lua); the rest is encoded here as
//
//	"" (no type, queue or payload: an adopted id), or
//	"1" <len(type)> ":" type <len(queue)> ":" queue payload
//
// A dead entry's info is "<len(reason)>:" reason record.

// newRecord is the record of a job scheduled at score, no attempts spent;
// "" (none) for a job with no type, queue or payload, whose claim takes the
// due from its score.
func newRecord(score string, j *Job) string {
	rest := encodeRest(j.Type, j.Queue, j.Payload)
	if rest == "" {
		return ""
	}
	return "0@" + score + ":" + rest
}

// encodeRest encodes the part of a record after "<attempts>:".
func encodeRest(typ, queue string, payload []byte) string {
	if typ == "" && queue == "" && len(payload) == 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(8 + len(typ) + len(queue) + len(payload))
	b.WriteByte('1')
	b.WriteString(strconv.Itoa(len(typ)))
	b.WriteByte(':')
	b.WriteString(typ)
	b.WriteString(strconv.Itoa(len(queue)))
	b.WriteByte(':')
	b.WriteString(queue)
	b.Write(payload)
	return b.String()
}

// decodeRecord parses "<attempts>[@<due>[~<score>]]:<rest>" into the job
// fields it carries; due is the occurrence's score ("" when the record has
// none). A waiting retry's record also names the score it was put back at
// (see lua/prelude.lua), which only a claim compares.
func decodeRecord(rec string, j *Job) (attempts int, due string, err error) {
	head, rest, ok := strings.Cut(rec, ":")
	if !ok {
		return 0, "", fmt.Errorf("%w: record without attempts", ErrCorrupt)
	}
	a, due, _ := strings.Cut(head, "@")
	due, _, _ = strings.Cut(due, "~")
	attempts, err = strconv.Atoi(a)
	if err != nil || attempts < 0 || strconv.Itoa(attempts) != a {
		return 0, "", fmt.Errorf("%w: record attempts %q", ErrCorrupt, a)
	}
	if rest == "" {
		return attempts, due, nil
	}
	if rest[0] != '1' {
		return 0, "", fmt.Errorf("%w: record version %q", ErrCorrupt, rest[:1])
	}
	rest = rest[1:]
	var typ, queue string
	if typ, rest, err = lenPrefixed(rest); err != nil {
		return 0, "", err
	}
	if queue, rest, err = lenPrefixed(rest); err != nil {
		return 0, "", err
	}
	j.Type, j.Queue = typ, queue
	if rest != "" {
		j.Payload = []byte(rest)
	}
	return attempts, due, nil
}

// lenPrefixed splits "<n>:" + n bytes off the front of s.
func lenPrefixed(s string) (field, rest string, err error) {
	ns, rest, ok := strings.Cut(s, ":")
	if !ok || len(ns) == 0 || len(ns) > 10 {
		return "", "", fmt.Errorf("%w: record field length missing", ErrCorrupt)
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 0 || n > len(rest) || strconv.Itoa(n) != ns { // canonical decimal only
		return "", "", fmt.Errorf("%w: record field length %q", ErrCorrupt, ns)
	}
	return rest[:n], rest[n:], nil
}

// decodeDeadInfo parses "<len(reason)>:" reason record.
func decodeDeadInfo(info string, j *Job) (reason string, attempts int, due string, err error) {
	reason, rec, err := lenPrefixed(info)
	if err != nil {
		return "", 0, "", err
	}
	attempts, due, err = decodeRecord(rec, j)
	return reason, attempts, due, err
}
