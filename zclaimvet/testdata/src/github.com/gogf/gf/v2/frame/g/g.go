// Package g stands in for GoFrame's g: Redis.
package g

import "github.com/gogf/gf/v2/database/gredis"

func Redis(name ...string) *gredis.Redis { return nil }
