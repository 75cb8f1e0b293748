package router_test

import (
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/router"
)

func ExampleRouter_Route() {
	opts := router.DefaultOptions()
	// As in a Kafka Connect connector configuration.
	if err := opts.Set("table.fields.additional.placement", "type:header:eventType"); err != nil {
		panic(err)
	}
	r, err := router.New(opts)
	if err != nil {
		panic(err)
	}
	row := &router.Row{
		Table: "public.outbox",
		Op:    router.OpInsert,
		Names: []string{"id", "aggregatetype", "aggregateid", "type", "payload"},
		Types: []uint32{2950, 1043, 1043, 1043, 3802},
		Values: [][]byte{
			[]byte("406c07f3-26f0-4eea-a50c-109940064b8f"),
			[]byte("Order"),
			[]byte("1"),
			[]byte("OrderCreated"),
			[]byte(`{"total":12}`),
		},
	}
	var rec router.Record
	action, err := r.Route(row, time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), &rec)
	if err != nil {
		panic(err)
	}
	fmt.Println(action, rec.Topic, string(rec.Key), string(rec.Value), rec.Partition, rec.Timestamp)
	for _, h := range rec.Headers {
		fmt.Printf("%s=%s\n", h.Key, h.Value)
	}
	// Output:
	// emit outbox.event.Order 1 {"total":12} -1 2024-01-02 03:04:05 +0000 UTC
	// id=406c07f3-26f0-4eea-a50c-109940064b8f
	// eventType=OrderCreated
}

func ExampleOptions_Validate() {
	opts := router.DefaultOptions()
	opts.OpInvalidBehavior = "ignore"
	opts.RouteTopicReplacement = "outbox.${aggregate}"
	fmt.Println(opts.Validate())
	// Output:
	// router: option table.op.invalid.behavior="ignore": must be warn, error or fatal
	// router: option route.topic.replacement="outbox.${aggregate}": no group with name {aggregate} in route.topic.regex
}

func ExampleNewSet() {
	def := router.DefaultOptions()
	audit := def // a table of its own: every row to one topic
	audit.RouteTopic = "audit.events"
	set, err := router.NewSet(def, map[string]router.Options{"public.audit_outbox": audit})
	if err != nil {
		panic(err)
	}
	row := &router.Row{
		Table:  "public.audit_outbox",
		Op:     router.OpInsert,
		Names:  []string{"id", "aggregatetype", "aggregateid", "type", "payload"},
		Values: [][]byte{[]byte("1"), []byte("Login"), []byte("u-7"), []byte("LoggedIn"), []byte(`{"ok":true}`)},
	}
	var rec router.Record
	if _, err := set.Route(row, time.Now(), &rec); err != nil {
		panic(err)
	}
	fmt.Println(rec.Topic, string(rec.Key))
	row.Table = "public.outbox" // any other table: the default options
	if _, err := set.Route(row, time.Now(), &rec); err != nil {
		panic(err)
	}
	fmt.Println(rec.Topic, string(rec.Key))
	// Output:
	// audit.events u-7
	// outbox.event.Login u-7
}

func ExampleOptions_Set_kafkaConnectEncoding() {
	// A migrated Kafka Connect configuration: JsonConverter without schemas.
	opts := router.DefaultOptions()
	for k, v := range map[string]string{
		"key.converter":                  "org.apache.kafka.connect.json.JsonConverter",
		"key.converter.schemas.enable":   "false",
		"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "false",
	} {
		if err := opts.Set(k, v); err != nil {
			panic(err)
		}
	}
	r, err := router.New(opts)
	if err != nil {
		panic(err)
	}
	row := &router.Row{
		Table:  "public.outbox",
		Op:     router.OpInsert,
		Names:  []string{"id", "aggregatetype", "aggregateid", "type", "payload"},
		Types:  []uint32{2950, 1043, 1043, 1043, 3802},
		Values: [][]byte{[]byte("406c07f3-26f0-4eea-a50c-109940064b8f"), []byte("Order"), []byte("1"), []byte("OrderCreated"), []byte(`{"total": 12}`)},
	}
	var rec router.Record
	if _, err := r.Route(row, time.Now(), &rec); err != nil {
		panic(err)
	}
	fmt.Printf("key %s value %s\n", rec.Key, rec.Value)
	// Output:
	// key "1" value "{\"total\": 12}"
}
