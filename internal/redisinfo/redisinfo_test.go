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

func TestServer(t *testing.T) {
	for info, want := range map[string][2]string{
		"# Server\r\nredis_version:7.0.15\r\n":                                              {"Redis", "7.0.15"},
		"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n": {"Valkey", "8.1.1"},
	} {
		if name, version := Server(info); name != want[0] || version != want[1] {
			t.Errorf("Server(%q) = %s %s, want %s %s", info, name, version, want[0], want[1])
		}
	}
}
