package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
)

// A standby (another instance streams from the slot) checks, besides the
// slot, what its takeover will need: PostgreSQL answered (Prepare did),
// the configured event columns are in the publication, Kafka's brokers
// answer and accept its credentials, and the dead-letter topic exists
// where poison records go there. Without the check a standby with a wrong
// kafka.brokers or SASL setting stood by as healthy as any, a rolling
// update replaced the working pods with it, and the stream stopped at the
// takeover with the probes still passing (a Kubernetes review). The
// outcome goes to the observer (StandingBy), whose /rolloutz a rolling
// update waits on.

// standbyCheckEvery is how often a standby checks; in between, each poll
// of the slot reports the last outcome again.
const standbyCheckEvery = 30 * time.Second

// standbyCheckTimeout bounds one check of Kafka.
const standbyCheckTimeout = 10 * time.Second

// standbyState is the last check's outcome.
type standbyState struct {
	at  time.Time
	err error
}

// standingBy reports that this instance stands by, checking what a
// takeover needs at most every standbyCheckEvery.
func (r *Relay) standingBy(ctx context.Context, start replication.Start) {
	now := r.clock.Now()
	if r.standby.at.IsZero() || now.Sub(r.standby.at) >= standbyCheckEvery {
		was := r.standby.err
		err := r.standbyCheck(ctx, start)
		if ctx.Err() != nil {
			return
		}
		r.standby = standbyState{at: now, err: err}
		switch {
		case err != nil:
			r.log.Error("standby: a takeover of the slot would fail: the instance is not available for a rolling update (/rolloutz) until this is mended", zap.Error(err),
				zap.Duration("next_check_in", standbyCheckEvery))
		case was != nil:
			r.log.Info("standby: PostgreSQL and Kafka answer again; available for a takeover")
		}
	}
	r.obs.StandingBy(r.standby.err)
}

// standbyCheck checks what a takeover needs besides the slot.
func (r *Relay) standbyCheck(ctx context.Context, start replication.Start) error {
	if err := r.checkColumns(&start.Catalog); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, standbyCheckTimeout)
	defer cancel()
	// Any topic serves to see the brokers answer and accept the
	// credentials; the dead-letter topic must also exist.
	topic := r.cfg.Kafka.OffsetsTopic
	dlq := r.cfg.Relay.PoisonPolicy == "dead-letter" && !r.cfg.Kafka.AutoCreateTopics
	if dlq {
		topic = r.cfg.Relay.DeadLetterTopic
	}
	st, err := r.be.CheckTopics(ctx, r.cfg.Kafka, []string{topic})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", standbyCheckTimeout, err)
		}
		return fmt.Errorf("relay: standby: kafka.brokers %v: %w", r.cfg.Kafka.Brokers, err)
	}
	if dlq && len(st) > 0 && st[0].Err != nil {
		return fmt.Errorf("relay: standby: dead.letter.topic %q: %w; create it (poison.policy=dead-letter sends the records that cannot be relayed there), or set kafka.auto.create.topics", r.cfg.Relay.DeadLetterTopic, st[0].Err)
	}
	return nil
}
