package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// warmTxnCoordinator makes sure the cluster has a transaction coordinator
// before the first exactly-once run: on a broker that never saw a
// transaction, the first FindCoordinator only starts creating
// __transaction_state and is answered COORDINATOR_NOT_AVAILABLE. That
// one-time creation is no part of what the runs measure, and a producer
// that meets it can be held up for long: sarama then waits for
// __consumer_offsets as well, through every metadata retry, and a cluster
// that never had a consumer group does not have that topic. The harness
// asks itself, with a throwaway key, until a coordinator answers.
func (h *harness) warmTxnCoordinator(ctx context.Context) error {
	sc, err := h.kcfg.Sarama()
	if err != nil {
		return err
	}
	client, err := sarama.NewClient(h.o.Brokers, sc)
	if err != nil {
		return fmt.Errorf("kafka: connect: %w", err)
	}
	defer client.Close()
	req := &sarama.FindCoordinatorRequest{Version: 1, CoordinatorKey: h.name("warmup"), CoordinatorType: sarama.CoordinatorTransaction}
	if sc.Version.IsAtLeast(sarama.V2_0_0_0) {
		req.Version = 2
	}
	deadline := time.Now().Add(time.Minute)
	for {
		b := client.LeastLoadedBroker()
		if b == nil {
			return errors.New("kafka: no broker to ask for a transaction coordinator")
		}
		resp, err := b.FindCoordinator(req)
		if err == nil && errors.Is(resp.Err, sarama.ErrNoError) {
			return nil
		}
		if err == nil {
			err = resp.Err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kafka: no transaction coordinator within a minute: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
