package zclaimprom_test

import (
	"log"
	"net/http"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimprom"
)

// Export a schedule's counts, its dispatcher's and its middleware's, on
// /metrics. dashboards/ holds a Grafana dashboard and alert rules for
// them.
func ExampleNewCollector() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "delay:jobs"})
	if err != nil {
		log.Fatal(err)
	}
	store, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{})
	if err != nil {
		log.Fatal(err)
	}
	dispatcher, err := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(rdb), zclaim.DispatcherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(zclaimprom.NewCollector(zclaimprom.Options{
		Brokers:     []*zclaim.Broker{broker},
		Dispatchers: []*zclaim.Dispatcher{dispatcher},
		Idempotency: []*zclaim.Idempotency{store},
	}))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe("127.0.0.1:2112", nil))
}
