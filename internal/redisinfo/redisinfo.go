// Package redisinfo reads the replies of Redis' INFO command, for zclaim,
// its test harness and its benchmarks alike.
package redisinfo

import "strings"

// Field returns the value of field in an INFO reply ("" if absent).
func Field(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
