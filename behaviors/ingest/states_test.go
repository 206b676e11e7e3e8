package ingest_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/behaviors/ingest"
)

// The transition tables of FACTS §4, written out again so that the test
// checks the code against the facts, not against itself.
var (
	factsJobTable = map[ingest.JobState][]ingest.JobState{
		"Pending":      {"Held", "Estimating", "Failed"},
		"Held":         {"Pending", "Deleted"},
		"Estimating":   {"Provisioning", "Failed"},
		"Provisioning": {"Downloading", "Failed"},
		"Downloading":  {"Processing", "Failed"},
		"Processing":   {"Storing", "Failed"},
		"Storing":      {"Recording", "Failed"},
		"Recording":    {"Notify", "Failed"},
		"Notify":       {"Completed", "Failed"},
		"Failed":       {"Pending", "Estimating", "Provisioning", "Downloading", "Processing", "Storing", "Recording", "Notify", "Deleted"},
		"Completed":    nil,
		"Deleted":      nil,
	}
	factsBatchTable = map[ingest.BatchState][]ingest.BatchState{
		"Pending":         {"Held", "Processing"},
		"Held":            {"Pending", "Deleted"},
		"Processing":      {"Reporting", "Failed"},
		"Reporting":       {"Completed", "Failed"},
		"Failed":          {"UpdateReporting", "Deleted"},
		"UpdateReporting": {"Completed", "Failed"},
		"Completed":       nil,
		"Deleted":         nil,
	}
)

func TestJobTransitionTable(t *testing.T) {
	t.Parallel()
	require.Len(t, ingest.JobStates, len(factsJobTable))
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, from := range ingest.JobStates {
		for _, to := range ingest.JobStates {
			allowed := contains(factsJobTable[from], to)
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				require.Equal(t, allowed, ingest.JobTransitionAllowed(from, to))
				p := ingest.JobProgress{Status: from, LastSuccessfulStatus: "Estimating", RetryCount: 2}
				before := p
				err := p.Transition(to, now)
				if !allowed {
					require.ErrorIs(t, err, ingest.ErrIllegalTransition)
					require.Equal(t, before, p, "an illegal transition changes nothing")
					return
				}
				require.NoError(t, err)
				require.Equal(t, to, p.Status)
				require.Equal(t, now, p.LastModified)
				require.Equal(t, 2, p.RetryCount, "only a requeue counts retries")
				// last_successful_status is the old state, except on moves to
				// or from Failed and Deleted.
				want := from
				if to == ingest.JobFailed || to == ingest.JobDeleted || from == ingest.JobFailed || from == ingest.JobDeleted {
					want = "Estimating"
				}
				require.Equal(t, want, p.LastSuccessfulStatus)
				require.Equal(t, ingest.Transition{From: string(from), To: string(to), At: now}, p.History[len(p.History)-1])
			})
		}
	}
	// A job that never ran is Pending.
	require.True(t, ingest.JobTransitionAllowed("", ingest.JobEstimating))
	require.False(t, ingest.JobTransitionAllowed("", ingest.JobCompleted))
}

func TestBatchTransitionTable(t *testing.T) {
	t.Parallel()
	require.Len(t, ingest.BatchStates, len(factsBatchTable))
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, from := range ingest.BatchStates {
		for _, to := range ingest.BatchStates {
			allowed := contains(factsBatchTable[from], to)
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				require.Equal(t, allowed, ingest.BatchTransitionAllowed(from, to))
				p := ingest.BatchProgress{Status: from, Jobs: 3}
				before := p
				err := p.Transition(to, now)
				if !allowed {
					require.ErrorIs(t, err, ingest.ErrIllegalTransition)
					require.Equal(t, before, p, "an illegal transition changes nothing")
					return
				}
				require.NoError(t, err)
				require.Equal(t, to, p.Status)
				require.Equal(t, now, p.LastModified)
			})
		}
	}
}

func TestRequeueResumesAfterLastSuccessfulStatus(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	for _, tc := range []struct {
		lss, want ingest.JobState
	}{
		{"", ingest.JobEstimating},
		{ingest.JobPending, ingest.JobEstimating},
		{ingest.JobHeld, ingest.JobEstimating},
		{ingest.JobEstimating, ingest.JobProvisioning},
		{ingest.JobProvisioning, ingest.JobDownloading},
		{ingest.JobDownloading, ingest.JobProcessing},
		{ingest.JobProcessing, ingest.JobStoring},
		{ingest.JobStoring, ingest.JobRecording},
		{ingest.JobRecording, ingest.JobNotify},
	} {
		p := ingest.JobProgress{Status: ingest.JobFailed, LastSuccessfulStatus: tc.lss, RetryCount: 1, Error: "boom"}
		require.NoError(t, p.Requeue(now), "last successful %q", tc.lss)
		require.Equal(t, tc.want, p.Status, "last successful %q", tc.lss)
		require.Equal(t, tc.lss, p.LastSuccessfulStatus, "moving out of Failed keeps last_successful_status")
		require.Equal(t, 2, p.RetryCount)
		require.Empty(t, p.Error)
	}
	// Only a Failed job is requeued.
	for _, s := range ingest.JobStates {
		if s == ingest.JobFailed {
			continue
		}
		p := ingest.JobProgress{Status: s}
		before := p
		err := p.Requeue(now)
		require.True(t, errors.Is(err, ingest.ErrIllegalTransition), "requeue from %s", s)
		require.Equal(t, before, p)
	}
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
