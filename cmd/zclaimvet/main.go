// Command zclaimvet reports racy sorted-set pollers: a ZRANGEBYSCORE and a
// ZREM of the members read, sent as two requests (see package zclaimvet).
//
//	go install github.com/zclaim/zclaim/cmd/zclaimvet@latest
//	go vet -vettool=$(which zclaimvet) ./...   # as a vet tool
//	zclaimvet ./...                            # or on its own
package main

import (
	"github.com/zclaim/zclaim/zclaimvet"
	"golang.org/x/tools/go/analysis/singlechecker"
)

func main() { singlechecker.Main(zclaimvet.Analyzer) }
