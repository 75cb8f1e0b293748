package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server serves a handler over HTTP until its context ends, then shuts
// down gracefully.
//
// Concurrency: Listen, Run and Addr may be called from any goroutine; call
// Run once.
type Server struct {
	// ShutdownTimeout bounds the graceful shutdown when Run's context
	// ends: requests still running after it are cut off. Default 5 s.
	ShutdownTimeout time.Duration

	srv *http.Server
	mu  sync.Mutex
	ln  net.Listener
}

// NewServer returns a server for h on addr (host:port; ":0" picks a free
// port). It does not listen yet.
func NewServer(addr string, h http.Handler) *Server {
	return &Server{
		ShutdownTimeout: 5 * time.Second,
		srv: &http.Server{
			Addr:              addr,
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
		},
	}
}

// Listen binds the address. Calling it before Run is optional; it lets the
// caller fail fast on an address that is taken or invalid, before starting
// anything else, and learn the port with Addr.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.srv.Addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", s.srv.Addr, err)
	}
	s.ln = ln
	return nil
}

// Addr is the address the server listens on ("" before Listen).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run listens (unless Listen did) and serves until ctx ends; then it stops
// accepting, waits up to ShutdownTimeout for running requests, closes what
// is left and returns nil. It returns an error if it cannot listen or the
// server fails.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("metrics: serve HTTP on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ShutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if err != nil {
		_ = s.srv.Close()
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("metrics: shut down HTTP server on %s: %w", ln.Addr(), err)
	}
	return nil
}
