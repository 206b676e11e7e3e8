package web

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Timeouts and limits of the server NewServer returns.
const (
	// ReadHeaderTimeout bounds reading a request's header.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout = 30 * time.Second
	// WriteTimeout bounds writing a response; event streams extend it
	// before each write.
	WriteTimeout = 30 * time.Second
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes caps a request's header.
	MaxHeaderBytes = 64 << 10
)

// NewServer returns an http.Server for h with the timeouts above. Its
// Shutdown also ends the open event streams, which would otherwise keep it
// waiting until its context ends.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.Default()
	}
	base, cancel := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(cancel)
	return srv
}
