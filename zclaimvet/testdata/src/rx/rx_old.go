package rx

import radixold "github.com/mediocregopher/radix"

// radix v3 from its path before modules.
func pollOld(c radixold.Client) {
	var ids []string
	c.Do(radixold.Cmd(&ids, "ZRANGEBYSCORE", "mqueue", "-1", "(0")) // want `racy poller: ZRANGEBYSCORE reads due members of "mqueue" here, and ZREM at rx_old.go:\d+`
	for _, id := range ids {
		c.Do(radixold.Cmd(nil, "ZREM", "mqueue", id))
		run(id)
	}
}
