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

// Server returns the server's name and version from an INFO server reply:
// "Valkey" and valkey_version where the reply has one (Valkey's
// redis_version is the Redis it is compatible with), else "Redis" and
// redis_version.
func Server(info string) (name, version string) {
	if v := Field(info, "valkey_version"); v != "" {
		return "Valkey", v
	}
	return "Redis", Field(info, "redis_version")
}
