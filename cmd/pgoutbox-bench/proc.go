package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProcStats are resources of one process, read from /proc.
type ProcStats struct {
	// PeakRSSBytes is VmHWM of /proc/<pid>/status: the peak resident set.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// RSSAnonBytes and RSSFileBytes are RssAnon and RssFile of the same
	// read: the resident set then, split into anonymous memory (heap,
	// stacks, a JVM's heap and code cache) and pages of mapped files (the
	// executable, shared libraries, a JVM's modules and class data). The
	// file pages are clean and the kernel may drop them under pressure;
	// how many of a file it maps on a fault depends on the kernel.
	RSSAnonBytes int64 `json:"rss_anon_bytes,omitempty"`
	RSSFileBytes int64 `json:"rss_file_bytes,omitempty"`
	// CPUSeconds is utime+stime of /proc/<pid>/stat (user and system CPU
	// time of every thread so far).
	CPUSeconds float64 `json:"cpu_s"`
	// ReadSyscalls and WriteSyscalls are syscr and syscw of
	// /proc/<pid>/io: read(2)- and write(2)-like system calls, socket
	// reads and writes included (not epoll_wait, futex or nanosleep).
	ReadSyscalls  int64 `json:"read_syscalls"`
	WriteSyscalls int64 `json:"write_syscalls"`
	// VoluntarySwitches counts the times a thread blocked (waiting for
	// data, a timer or another thread), InvoluntarySwitches the times the
	// scheduler took the CPU away; summed over the process's threads.
	VoluntarySwitches   int64 `json:"voluntary_ctx_switches"`
	InvoluntarySwitches int64 `json:"involuntary_ctx_switches"`
	// RunQueueSeconds is the time the process's threads were ready to run
	// but waited for a CPU (the second field of /proc/<pid>/task/*/schedstat),
	// summed over its threads: CPU contention on the machine.
	RunQueueSeconds float64 `json:"run_queue_s"`
}

// since returns the counters from earlier to s (the resident sets are s's).
func (s ProcStats) since(earlier ProcStats) ProcStats {
	return ProcStats{
		PeakRSSBytes:        s.PeakRSSBytes,
		RSSAnonBytes:        s.RSSAnonBytes,
		RSSFileBytes:        s.RSSFileBytes,
		CPUSeconds:          s.CPUSeconds - earlier.CPUSeconds,
		ReadSyscalls:        s.ReadSyscalls - earlier.ReadSyscalls,
		WriteSyscalls:       s.WriteSyscalls - earlier.WriteSyscalls,
		VoluntarySwitches:   s.VoluntarySwitches - earlier.VoluntarySwitches,
		InvoluntarySwitches: s.InvoluntarySwitches - earlier.InvoluntarySwitches,
		RunQueueSeconds:     s.RunQueueSeconds - earlier.RunQueueSeconds,
	}
}

var (
	clkTckOnce sync.Once
	clkTck     = 100.0
)

// clockTicks returns the kernel's USER_HZ, the unit of /proc/<pid>/stat's
// times (100 on every common Linux; asked of getconf when it is there).
func clockTicks() float64 {
	clkTckOnce.Do(func() {
		out, err := exec.Command("getconf", "CLK_TCK").Output()
		if err != nil {
			return
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			clkTck = v
		}
	})
	return clkTck
}

// readProcStats reads the peak RSS, the CPU time, the system call and the
// context switch counts of pid. Only the CPU time is required: the other
// counters stay 0 where /proc does not show them.
func readProcStats(pid int) (ProcStats, error) {
	var s ProcStats
	cpu, err := readCPUSeconds(pid)
	if err != nil {
		return s, err
	}
	s.CPUSeconds = cpu
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	if kb, ok := statusField(status, "VmHWM:"); ok {
		s.PeakRSSBytes = kb * 1024 // "123456 kB"
	}
	if kb, ok := statusField(status, "RssAnon:"); ok {
		s.RSSAnonBytes = kb * 1024
	}
	if kb, ok := statusField(status, "RssFile:"); ok {
		s.RSSFileBytes = kb * 1024
	}
	if io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid)); err == nil {
		s.ReadSyscalls, _ = statusField(io, "syscr:")
		s.WriteSyscalls, _ = statusField(io, "syscw:")
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		if st, err := os.ReadFile(t); err == nil {
			v, _ := statusField(st, "voluntary_ctxt_switches:")
			nv, _ := statusField(st, "nonvoluntary_ctxt_switches:")
			s.VoluntarySwitches += v
			s.InvoluntarySwitches += nv
		}
		if _, wait, err := readSchedstat(strings.TrimSuffix(t, "status") + "schedstat"); err == nil {
			s.RunQueueSeconds += wait
		}
	}
	return s, nil
}

// rssSplit says how s's resident set divides into anonymous memory and
// mapped files ("anon 9 MB + file 17 MB at the end of the writes"), or
// that /proc did not say.
func rssSplit(s ProcStats) string {
	if s.RSSAnonBytes == 0 && s.RSSFileBytes == 0 {
		return "anon/file split not read"
	}
	return fmt.Sprintf("anon %s MB + file %s MB at the end of the writes", mb(s.RSSAnonBytes), mb(s.RSSFileBytes))
}

// readSchedstat reads a /proc schedstat file: the task's CPU time and the
// time it waited on a run queue, in seconds.
func readSchedstat(path string) (cpu, wait float64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("%s: %q", path, data)
	}
	c, err1 := strconv.ParseInt(f[0], 10, 64)
	w, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	return float64(c) / 1e9, float64(w) / 1e9, nil
}

// statusField returns the first number after key at the start of a line
// of a /proc file of "key: value" lines.
func statusField(data []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			if f := strings.Fields(v); len(f) >= 1 {
				n, err := strconv.ParseInt(f[0], 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// readCPUSeconds reads utime+stime of pid from /proc/<pid>/stat.
func readCPUSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(data)
}

// parseStatCPU extracts utime+stime (fields 14 and 15) from the text of
// /proc/<pid>/stat, whose second field (the command in parentheses) may
// itself hold spaces and parentheses.
func parseStatCPU(data []byte) (float64, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat: no ')'")
	}
	f := strings.Fields(string(data[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc stat: %d fields after the command", len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed /proc stat: %w", err)
	}
	return float64(utime+stime) / clockTicks(), nil
}

// relayProc is a running pgoutbox process, its log in a file.
type relayProc struct {
	cmd     *exec.Cmd
	logPath string
	start   time.Time
	done    chan struct{}
	waitErr error
}

func startRelay(bin string, env []string, logPath string, args ...string) (*relayProc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"run"}, args...)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = lf, lf
	p := &relayProc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *relayProc) pid() int           { return p.cmd.Process.Pid }
func (p *relayProc) started() time.Time { return p.start }
func (p *relayProc) name() string       { return "pgoutbox" }

// exited reports whether the process has ended, with an error describing
// how and the tail of its log.
func (p *relayProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("pgoutbox exited early (%v); last log lines:\n%s", p.waitErr, p.logTail(15))
	default:
		return nil
	}
}

// stats reads the process's resources; call it before stop.
func (p *relayProc) stats() (ProcStats, error) {
	if err := p.exited(); err != nil {
		return ProcStats{}, err
	}
	return readProcStats(p.pid())
}

// stop sends SIGTERM and waits for a clean exit (pgoutbox drains and
// confirms first); after timeout it kills the process.
func (p *relayProc) stop(timeout time.Duration) error {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("pgoutbox did not exit within %s of SIGTERM; killed", timeout)
		}
	}
	if p.cmd.ProcessState.ExitCode() != 0 {
		return fmt.Errorf("pgoutbox exited with code %d after SIGTERM; last log lines:\n%s", p.cmd.ProcessState.ExitCode(), p.logTail(15))
	}
	return nil
}

func (p *relayProc) logTail(n int) string { return fileTail(p.logPath, n) }

// walsenderSampler follows the CPU time of the walsender that serves a
// slot (the server process that decodes the WAL for the reader): it asks
// for the slot's active_pid until there is one, then reads the process's
// /proc/<pid>/stat every walsenderPeriod. A walsender is a process of its
// own, started for the reader's connection, so its CPU time is the
// decoding's for that reader alone. After it exits, the last reading
// stands: the figure can fall short by up to one period's CPU.
type walsenderSampler struct {
	stopc chan struct{}
	done  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	pid     int32
	foundAt time.Time
	cpu     float64
	runq    float64 // seconds on a run queue, waiting for a CPU
}

// walsenderPeriod is how often the walsender's CPU time is read.
const walsenderPeriod = 5 * time.Millisecond

func startWalsenderSampler(dsn, slot string) *walsenderSampler {
	s := &walsenderSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-s.stopc:
				cancel()
			case <-s.done:
			}
		}()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(walsenderPeriod)
		defer tick.Stop()
		for {
			s.mu.Lock()
			pid := s.pid
			s.mu.Unlock()
			if pid == 0 {
				var p *int32
				if err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&p); err == nil && p != nil {
					s.mu.Lock()
					s.pid, s.foundAt = *p, time.Now()
					s.mu.Unlock()
				}
			}
			s.sample()
			select {
			case <-s.stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// sample reads the walsender's CPU seconds now (or returns the last sample
// once it is gone); 0 until the walsender was found.
func (s *walsenderSampler) sample() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pid != 0 {
		if cpu, err := readCPUSeconds(int(s.pid)); err == nil {
			s.cpu = cpu
			if _, w, err := readSchedstat(fmt.Sprintf("/proc/%d/schedstat", s.pid)); err == nil {
				s.runq = w
			}
		}
	}
	return s.cpu
}

// runQueue returns the walsender's time on a run queue at the last sample.
func (s *walsenderSampler) runQueue() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runq
}

// finish records the walsender's busy and run-queue shares from its
// appearance until end, from the last sample.
func (s *walsenderSampler) finish(end time.Time, rr *ReaderResult) {
	f := s.found()
	if f.IsZero() {
		return
	}
	rr.WalsenderSeconds = end.Sub(f).Seconds()
	rr.WalsenderBusy = rr.WalsenderCPUSeconds / rr.WalsenderSeconds
	rr.WalsenderRunQueue = s.runQueue() / rr.WalsenderSeconds
}

// found returns when the walsender was first seen (zero if never).
func (s *walsenderSampler) found() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.foundAt
}

// wait waits (bounded) until the walsender was found and returns its CPU
// seconds so far.
func (s *walsenderSampler) wait(timeout time.Duration) float64 {
	deadline := time.Now().Add(timeout)
	for {
		if !s.found().IsZero() || time.Now().After(deadline) {
			return s.sample()
		}
		time.Sleep(walsenderPeriod) // the sampler's query is under way
	}
}

// stop ends sampling and returns the walsender's CPU seconds (0 if it was
// never seen). It may be called more than once.
func (s *walsenderSampler) stop() float64 {
	s.once.Do(func() { close(s.stopc) })
	<-s.done
	return s.sample()
}

// machineCPU is a reading of the aggregate line of /proc/stat, in ticks.
type machineCPU struct{ busy, total uint64 }

func readMachineCPU() machineCPU {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return machineCPU{}
	}
	var m machineCPU
	for i, v := range f[1:] {
		if i >= 8 { // guest times are already in user and nice
			break
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		m.total += n
		if i != 3 && i != 4 { // idle, iowait
			m.busy += n
		}
	}
	return m
}

// busyUntil returns the share of CPU time that was busy from m to a later
// reading (0-1).
func (m machineCPU) busyUntil(later machineCPU) float64 {
	if later.total <= m.total {
		return 0
	}
	return float64(later.busy-m.busy) / float64(later.total-m.total)
}
