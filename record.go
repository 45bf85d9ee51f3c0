package zclaim

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// A record is what the broker keeps beside a job id: how many claims the
// run already had, the score its occurrence was first scheduled at, and
// the job's type, queue and payload. Scripts only read and rewrite the
// "<attempts>@<due>[~<score>]:" prefix (see prelude.lua); the rest is encoded here as
//
//	"" (no type, queue or payload: an adopted id), or
//	"1" <len(type)> ":" type <len(queue)> ":" queue payload, or, for a
//	job with headers,
//	"2" <len(type)> ":" type <len(queue)> ":" queue <n> ":" then n times
//	<len(name)> ":" name <len(value)> ":" value, then payload
//
// A dead entry's info is "<len(reason)>:" reason record.

// newRecord is the record of a job scheduled at score, no attempts spent;
// "" (none) for a job with no type, queue or payload, whose claim takes the
// due from its score.
func newRecord(score string, j *Job) string {
	rest := encodeRest(j.Type, j.Queue, j.Payload, j.Headers)
	if rest == "" {
		return ""
	}
	return "0@" + score + ":" + rest
}

// encodeRest encodes the part of a record after "<attempts>:".
func encodeRest(typ, queue string, payload []byte, headers map[string]string) string {
	if typ == "" && queue == "" && len(payload) == 0 && len(headers) == 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(8 + len(typ) + len(queue) + len(payload) + headersLen(headers))
	field := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	if len(headers) == 0 {
		b.WriteByte('1')
	} else {
		b.WriteByte('2')
	}
	field(typ)
	field(queue)
	if len(headers) > 0 {
		names := slices.Sorted(maps.Keys(headers))
		b.WriteString(strconv.Itoa(len(names)))
		b.WriteByte(':')
		for _, k := range names {
			field(k)
			field(headers[k])
		}
	}
	b.Write(payload)
	return b.String()
}

// headersLen is what headers add to a record, about: the size limit
// counts it.
func headersLen(headers map[string]string) int {
	n := 0
	for k, v := range headers {
		n += len(k) + len(v) + 8
	}
	return n
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
	version := rest[0]
	if version != '1' && version != '2' {
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
	if version == '2' {
		if j.Headers, rest, err = decodeHeaders(rest); err != nil {
			return 0, "", err
		}
	}
	if rest != "" {
		j.Payload = []byte(rest)
	}
	return attempts, due, nil
}

// decodeHeaders reads a version 2 record's headers off the front of s.
func decodeHeaders(s string) (map[string]string, string, error) {
	ns, rest, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 1 || n > len(rest) || strconv.Itoa(n) != ns {
		return nil, "", fmt.Errorf("%w: record header count %q", ErrCorrupt, ns)
	}
	h := make(map[string]string, n)
	prev := ""
	for i := range n {
		var k, v string
		if k, rest, err = lenPrefixed(rest); err != nil {
			return nil, "", err
		}
		if i > 0 && k <= prev { // written sorted, each name once
			return nil, "", fmt.Errorf("%w: record header %q out of order", ErrCorrupt, k)
		}
		prev = k
		if v, rest, err = lenPrefixed(rest); err != nil {
			return nil, "", err
		}
		h[k] = v
	}
	return h, rest, nil
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
