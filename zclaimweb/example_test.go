package zclaimweb_test

import (
	"log"
	"net/http"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimweb"
)

// Mount the console under /zclaim of a service's own mux, behind its
// operators' auth.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "delay:jobs"})
	if err != nil {
		log.Fatal(err)
	}
	h, err := zclaimweb.New(zclaimweb.Options{
		Schedules: []*zclaim.Broker{broker},
		Inspector: asynq.NewInspectorFromRedisClient(rdb),
		Root:      "/zclaim",
		Hosts:     []string{"ops.example.com"}, // the name the service is reached by
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/zclaim/", h) // wrap h in the service's own auth
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
