package zclaimvet

import (
	"slices"
	"testing"
)

// scriptRemoves on the shapes a script takes: which of its keys it removes
// members from without asking first.
func TestScriptRemoves(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []int
	}{
		{"unasked", "redis.call('ZREM', KEYS[1], ARGV[1])\nredis.call('RPUSH', KEYS[2], ARGV[1])", []int{0}},
		{"second key", "redis.call('RPUSH', KEYS[1], ARGV[1])\nredis.call('zrem', KEYS[2], ARGV[1])", []int{1}},
		{"through a local", "local inflight = KEYS[2]\nredis.call(\"ZREM\", inflight, ARGV[1])", []int{1}},
		{"a local of another key", "local k = KEYS[1] .. ':' .. ARGV[1]\nredis.call('ZREM', k, ARGV[1])", nil},
		{"score read first", "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\nredis.call('ZREM', KEYS[1], ARGV[1])", nil},
		{"reply tested", "if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then\nredis.call('RPUSH', KEYS[2], ARGV[1])\nend", nil},
		{"reply kept", "local n = redis.call('ZREM', KEYS[1], ARGV[1])\nreturn n", nil},
		{"another removal's reply tested", "if redis.call('LREM', KEYS[2], 0, ARGV[1]) == 0 then return 0 end\nredis.call('ZREM', KEYS[1], ARGV[1])", nil},
		{"compare-and-set", "if redis.call('HGET', KEYS[3], 'state') == ARGV[2] then\nredis.call('ZREM', KEYS[1], ARGV[1])\nend", nil},
		{"score compared with an argument", "if tonumber(ARGV[2]) > 0 then\nredis.call('ZREM', KEYS[1], ARGV[1])\nend", nil},
		{"existence is no compare", "for i = 1, #ARGV do\nif redis.call('EXISTS', 'job:' .. ARGV[i]) == 1 then\nredis.call('ZREM', KEYS[1], ARGV[i])\nend\nend", []int{0}},
		{"one line, after do", "for i = 1, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end", []int{0}},
		{"one line, in an if", "for i = 1, #ARGV do if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then end end", nil},
		{"claimed by its record: read, tested, deleted", "local msg = redis.call('GET', KEYS[2])\nif not msg then return nil end\n" +
			"redis.call('DEL', KEYS[2])\nredis.call('ZREM', KEYS[1], ARGV[1])\nreturn msg", nil},
		{"claimed by a hash field of a named record", "local rec = 'msg:' .. ARGV[1]\nif redis.call('HGET', rec, 'body') then\n" +
			"redis.call('HDEL', rec, 'body')\nredis.call('ZREM', KEYS[1], ARGV[1])\nend", nil},
		{"record read, not deleted", "local msg = redis.call('GET', KEYS[2])\nredis.call('ZREM', KEYS[1], ARGV[1])\nreturn msg", []int{0}},
		{"record deleted, not read", "redis.call('DEL', KEYS[2])\nredis.call('ZREM', KEYS[1], ARGV[1])", []int{0}},
		{"variable key index", "for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end", nil},
	} {
		if got := scriptRemoves(c.src); !slices.Equal(got, c.want) {
			t.Errorf("%s: scriptRemoves = %v, want %v", c.name, got, c.want)
		}
	}
}
