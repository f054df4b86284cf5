package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/internal/atomicfile"
)

// channelRate is the channel server's rate limit in bytes per second
// (default 32 MiB/s; LIKEN_LAB_CHANNEL_RATE changes it), so downloads in the
// lab take time as they do over a real network.
func channelRate() int64 {
	if v, err := strconv.ParseInt(os.Getenv("LIKEN_LAB_CHANNEL_RATE"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 32 << 20
}

// newChannelCommand is the lab's release channel: a plain web server
// sharing a directory, with HTTP Range support (net/http's file server)
// and a rate limit.
func newChannelCommand() *cobra.Command {
	var dir, portFile, certFile, keyFile string
	var where listenFlags
	cmd := &cobra.Command{
		Use:    "serve-channel --dir DIR --port-file FILE [--tls-cert FILE --tls-key FILE]",
		Short:  "Serve a release channel directory over HTTP(S) on loopback (started by liken lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := where.listen()
			if err != nil {
				return err
			}
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			if err := atomicfile.Write(portFile, []byte(port), 0o644); err != nil {
				return err
			}
			srv := &http.Server{
				Handler:           rateLimited(http.FileServer(http.Dir(dir)), channelRate()),
				ReadHeaderTimeout: 10 * time.Second,
			}
			go func() {
				<-cmd.Context().Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			}()
			serve := func() error { return srv.Serve(l) }
			if certFile != "" {
				serve = func() error { return srv.ServeTLS(l, certFile, keyFile) }
			}
			if err := serve(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the channel directory")
	cmd.Flags().StringVar(&portFile, "port-file", "", "where to write the chosen port")
	cmd.Flags().StringVar(&certFile, "tls-cert", "", "serve https with this certificate (PEM)")
	cmd.Flags().StringVar(&keyFile, "tls-key", "", "the certificate's private key (PEM)")
	cmd.MarkFlagsRequiredTogether("tls-cert", "tls-key")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagRequired("port-file")
	where.add(cmd.Flags())
	return cmd
}

// rateLimited sends each response at no more than rate bytes per second.
func rateLimited(h http.Handler, rate int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&slowWriter{ResponseWriter: w, rate: rate, start: time.Now()}, r)
	})
}

type slowWriter struct {
	http.ResponseWriter
	rate  int64
	start time.Time
	sent  int64
}

func (s *slowWriter) Write(p []byte) (int, error) {
	const chunk = 64 << 10
	written := 0
	for len(p) > 0 {
		n := min(len(p), chunk)
		m, err := s.ResponseWriter.Write(p[:n])
		written += m
		s.sent += int64(m)
		if err != nil {
			return written, err
		}
		p = p[n:]
		due := s.start.Add(time.Duration(float64(s.sent) / float64(s.rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
	}
	return written, nil
}

func (s *slowWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// waitPort waits for the server what (process pid) to write its port to
// portFile.
func waitPort(ctx context.Context, what, portFile string, pid int) (int, error) {
	for {
		if b, err := os.ReadFile(portFile); err == nil {
			if p, err := strconv.Atoi(string(b)); err == nil {
				return p, nil
			}
		}
		if !controlplane.Alive(pid) {
			return 0, fmt.Errorf("%s (pid %d) exited at start", what, pid)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitPIDFile waits for a supervisor to record the PID of the process it
// started.
func waitPIDFile(ctx context.Context, path string, supervisor int) (int, error) {
	for {
		if b, err := os.ReadFile(path); err == nil {
			if p, err := strconv.Atoi(string(b)); err == nil {
				return p, nil
			}
		}
		if !controlplane.Alive(supervisor) {
			return 0, fmt.Errorf("the supervisor (pid %d) exited before it started its process; see %s", supervisor, strings.TrimSuffix(path, ".pid")+".log")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
