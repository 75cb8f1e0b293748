// Command testenvctl does the parts of scripts/testenv.sh that are easier
// and sturdier in Go than in bash:
//
//	testenvctl ports N
//	    prints N distinct free TCP ports on 127.0.0.1, space-separated.
//	testenvctl kafka-ready -brokers 127.0.0.1:9092 [-timeout 90s] [-pid PID]
//	    waits until the broker answers a metadata request that lists at
//	    least one broker and a leader for every partition of every topic;
//	    exits 1 at the timeout, or as soon as process PID is gone.
//	    With -want-brokers N the metadata must list at least N brokers; with
//	    -broker-id ID it must list broker ID (a cluster node that was
//	    restarted is back once it has registered again).
//	testenvctl kafka-ok -brokers 127.0.0.1:9092 [-want-brokers N] [-broker-id ID]
//	    the same check once, with short timeouts (for health checks).
//	testenvctl certs DIR
//	    writes a throwaway certificate authority and certificates signed by
//	    it into DIR (see certs.go).
//
// It is internal to pkg/testenv: nothing but the script runs it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "ports":
		err = ports(os.Args[2:])
	case "kafka-ready":
		err = kafkaReady(os.Args[2:], false)
	case "kafka-ok":
		err = kafkaReady(os.Args[2:], true)
	case "certs":
		err = certs(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenvctl:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testenvctl ports N | kafka-ready -brokers ADDR[,ADDR] [-timeout D] [-pid PID] | kafka-ok -brokers ADDR [-want-brokers N] [-broker-id ID] | certs DIR")
	os.Exit(2)
}

// Ports are drawn below the kernel's ephemeral range (32768–60999 by
// default), so that outgoing connections made between the pick and the
// servers' bind cannot take them.
const (
	portLow  = 15000
	portHigh = 32767
)

func ports(args []string) error {
	if len(args) != 1 {
		usage()
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || n > 100 {
		return fmt.Errorf("ports: bad count %q", args[0])
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries > 2000 {
			return errors.New("ports: no free port found")
		}
		p := portLow + rand.IntN(portHigh-portLow+1)
		// Holding every listener until all are picked keeps them distinct.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		held = append(held, l)
		out = append(out, strconv.Itoa(p))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

func kafkaReady(args []string, once bool) error {
	fs := flag.NewFlagSet("kafka-ready", flag.ExitOnError)
	brokers := fs.String("brokers", "", "comma-separated broker addresses")
	timeout := fs.Duration("timeout", 90*time.Second, "give up after this long")
	pid := fs.Int("pid", 0, "fail as soon as this process is gone")
	want := fs.Int("want-brokers", 1, "the metadata must list at least this many brokers")
	id := fs.Int("broker-id", -1, "the metadata must list the broker with this node id")
	_ = fs.Parse(args)
	if *brokers == "" {
		usage()
	}
	addrs := strings.Split(*brokers, ",")

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0 // Kafka 4 refuses protocol versions before 2.1.
	cfg.ClientID = "pgoutbox-testenvctl"
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Net.WriteTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 0
	cfg.Metadata.Full = true

	check := func() error { return checkKafka(addrs, cfg, *want, int32(*id)) }
	if once {
		return check()
	}
	deadline := time.Now().Add(*timeout)
	for {
		if *pid > 0 && !alive(*pid) {
			return fmt.Errorf("kafka-ready: broker process %d exited", *pid)
		}
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kafka-ready: broker at %s not ready after %s: %w", *brokers, *timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// alive reports whether process pid exists and is not a zombie: an exited
// broker whose parent (often PID 1 here) has not reaped it yet still answers
// kill(pid, 0).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false
		}
		err := syscall.Kill(pid, 0) // no procfs: fall back to a signal probe
		return err == nil || errors.Is(err, syscall.EPERM)
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return true
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}

func checkKafka(addrs []string, cfg *sarama.Config, want int, id int32) error {
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }()
	if err := client.RefreshMetadata(); err != nil {
		return err
	}
	brokers := client.Brokers()
	if len(brokers) == 0 || len(brokers) < want {
		return fmt.Errorf("metadata lists %d brokers, want %d", len(brokers), max(want, 1))
	}
	if id >= 0 && !slices.ContainsFunc(brokers, func(b *sarama.Broker) bool { return b.ID() == id }) {
		return fmt.Errorf("metadata does not list broker %d (yet)", id)
	}
	topics, err := client.Topics()
	if err != nil {
		return err
	}
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			return fmt.Errorf("topic %s: %w", topic, err)
		}
		for _, p := range parts {
			if _, err := client.Leader(topic, p); err != nil {
				return fmt.Errorf("topic %s partition %d: %w", topic, p, err)
			}
		}
	}
	return nil
}
