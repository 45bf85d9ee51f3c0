package redisinfo

import "testing"

func TestField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nprocess_id:42\r\n\r\n# Memory\r\nused_memory:1024\r\n"
	for field, want := range map[string]string{"redis_version": "7.0.15", "process_id": "42", "used_memory": "1024",
		"used": "", "missing": ""} {
		if got := Field(info, field); got != want {
			t.Errorf("Field(%q) = %q, want %q", field, got, want)
		}
	}
}
