package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// LimitsResponse is the answer of GET /api/v1/limits: every rate limit and
// every concurrency cap set at runtime, with their use.
type LimitsResponse struct {
	// Rate are the rate limits by name.
	Rate []api.RateLimitInfo `json:"rate"`
	// Concurrency are the caps by behavior and key.
	Concurrency []api.ConcurrencyInfo `json:"concurrency"`
}

func (h *Handler) listLimits(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	rate, err := h.cfg.Client.RateLimits(r.Context())
	if err != nil {
		return fmt.Errorf("list rate limits: %w", err)
	}
	conc, err := h.cfg.Client.ConcurrencyLimits(r.Context())
	if err != nil {
		return fmt.Errorf("list concurrency limits: %w", err)
	}
	if rate == nil {
		rate = []api.RateLimitInfo{}
	}
	if conc == nil {
		conc = []api.ConcurrencyInfo{}
	}
	WriteJSON(w, http.StatusOK, LimitsResponse{Rate: rate, Concurrency: conc})
	return nil
}

// RateLimitBody is the body of PUT /api/v1/limits/rate/{name}.
type RateLimitBody struct {
	// Limit is the most units a key may start per period, and its burst.
	Limit int64 `json:"limit"`
	// Period is the time over which Limit units refill: a Go duration
	// such as "1m" or "1h30m" (GET /api/v1/limits shows "1m0s"), or a
	// number of nanoseconds, as earlier releases showed it.
	Period json.RawMessage `json:"period"`
}

// parsePeriod reads the period of a RateLimitBody: a duration string or a
// whole number of nanoseconds. Its range is the engine's to judge.
func parsePeriod(raw json.RawMessage) (time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, invalid("period", "missing; want a duration such as \"1m\"")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, invalid("period", "%q is not a duration such as \"1s\", \"1m\" or \"1h30m\"", s)
		}
		return d, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, invalid("period", "%s is neither a duration string such as \"1m\" nor a whole number of nanoseconds", raw)
	}
	return time.Duration(n), nil
}

func (h *Handler) setRateLimit(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	var body RateLimitBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	period, err := parsePeriod(body.Period)
	if err != nil {
		return err
	}
	l := api.RateLimit{Name: r.PathValue("name"), Limit: body.Limit, Period: period}
	if err := h.cfg.Client.SetRateLimit(r.Context(), l); err != nil {
		return fmt.Errorf("set rate limit %q: %w", l.Name, err)
	}
	WriteJSON(w, http.StatusOK, l)
	return nil
}

func (h *Handler) removeRateLimit(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	name := r.PathValue("name")
	err := h.cfg.Client.RemoveRateLimit(r.Context(), name)
	if errors.Is(err, api.ErrNotFound) {
		return notFound("no rate limit %q", name)
	}
	if err != nil {
		return fmt.Errorf("remove rate limit %q: %w", name, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ConcurrencyLimitBody is the body of PUT
// /api/v1/limits/concurrency/{behavior}.
type ConcurrencyLimitBody struct {
	// Key is the group key the cap is for; absent or empty for the
	// behavior as a whole.
	Key string `json:"key,omitempty"`
	// Max is the most tasks that may run at once; zero on a key keeps
	// the behavior's policy cap and sets only Weight.
	Max int `json:"max"`
	// Weight is the key's share under fair share; zero means 1.
	Weight int `json:"weight,omitempty"`
	// Force sets the cap of a behavior that the server does not register
	// and no live node runs: one whose nodes are not deployed yet. Without
	// it (the default) such a behavior is a 400.
	Force bool `json:"force,omitempty"`
}

func (h *Handler) setConcurrencyLimit(w http.ResponseWriter, r *http.Request) error {
	if _, err := Query(r); err != nil {
		return err
	}
	behavior := api.BehaviorID(r.PathValue("behavior"))
	if err := spi.CheckBehaviorID(behavior); err != nil {
		return err
	}
	var body ConcurrencyLimitBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	l := api.ConcurrencyLimit{Behavior: behavior, Key: body.Key, Max: body.Max, Weight: body.Weight, Force: body.Force}
	if err := h.cfg.Client.SetConcurrencyLimit(r.Context(), l); err != nil {
		var inv *api.InvalidError
		if errors.Is(err, api.ErrUnknownBehavior) && errors.As(err, &inv) {
			return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: inv.Field,
				Message: inv.Error() + `; send "force": true to set it for a behavior whose nodes are not deployed yet`}
		}
		return err
	}
	l.Force = false // an input, not part of the cap
	WriteJSON(w, http.StatusOK, l)
	return nil
}

func (h *Handler) removeConcurrencyLimit(w http.ResponseWriter, r *http.Request) error {
	q, err := Query(r, "key")
	if err != nil {
		return err
	}
	behavior := api.BehaviorID(r.PathValue("behavior"))
	if err := spi.CheckBehaviorID(behavior); err != nil {
		return err
	}
	key := q.Get("key")
	err = h.cfg.Client.RemoveConcurrencyLimit(r.Context(), behavior, key)
	if errors.Is(err, api.ErrNotFound) {
		if key == "" {
			return notFound("no concurrency limit for behavior %s as a whole", behavior)
		}
		return notFound("no concurrency limit for key %q of behavior %s", key, behavior)
	}
	if err != nil {
		return fmt.Errorf("remove concurrency limit of %s: %w", behavior, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
