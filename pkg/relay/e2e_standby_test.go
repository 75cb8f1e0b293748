package relay_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// standbyReports records StandingBy's reports.
type standbyReports struct {
	relay.NopObserver
	mu   sync.Mutex
	errs []error
}

func (o *standbyReports) StandingBy(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

func (o *standbyReports) last() (error, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.errs) == 0 {
		return nil, 0
	}
	return o.errs[len(o.errs)-1], len(o.errs)
}

// TestStandbyChecksWhatItsTakeoverNeeds: a standby with a wrong
// kafka.brokers stood by as healthy as one with the right ones, so a
// rolling update replaced the working pods with it, and the stream stopped
// at the takeover with every probe passing (a Kubernetes review). A standby
// now checks Kafka (and the event columns, and the dead-letter topic) and
// reports the outcome, which /rolloutz, the chart's readiness probe, reads.
// Real PostgreSQL and Kafka: one relay streams, a second with the same
// configuration stands by and reports nothing wrong, a third with an
// unreachable broker stands by and reports it.
func TestStandbyChecksWhatItsTakeoverNeeds(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	runRelay(t, f.config())
	f.waitStreaming(t)
	good, bad := &standbyReports{}, &standbyReports{}
	runRelayLog(t, f.config(), zap.NewNop(), relay.WithObserver(good))
	cfg := f.config()
	cfg.Kafka.Brokers = []string{"127.0.0.1:1"}
	runRelayLog(t, cfg, zap.NewNop(), relay.WithObserver(bad))
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		gerr, gn := good.last()
		berr, bn := bad.last()
		return gn > 0 && bn > 0, fmt.Sprintf("good: %d reports (last %v); bad: %d reports (last %v)", gn, gerr, bn, berr)
	})
	if err, _ := good.last(); err != nil {
		t.Fatalf("the standby with the streaming relay's configuration reports %v", err)
	}
	if err, _ := bad.last(); err == nil || !strings.Contains(err.Error(), "kafka.brokers [127.0.0.1:1]") {
		t.Fatalf("the standby with an unreachable broker reports %v; want an error naming kafka.brokers", err)
	}
}
