// Package demo holds demo.echo, a small behavior that shows a full round
// trip (submit, run, await) before any real work is involved.
package demo

import (
	"context"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// EchoParams are the params of demo.echo.
type EchoParams struct {
	// Text is echoed back. Required; at most 1,000 bytes.
	Text string `json:"text" validate:"required,max=1000"`
	// Upper turns the echo into upper case.
	Upper bool `json:"upper,omitempty"`
	// DelayMS makes the run take this long, to watch a task run. At most
	// one minute.
	DelayMS int `json:"delay_ms,omitempty" validate:"gte=0,lte=60000"`
	// Steps makes the run checkpoint this many steps after the delay,
	// each kept as a step of the task (spi.Policy.KeepSteps), to rewind
	// or fork it from one. A run resumes after the last step its progress
	// counts. At most 100.
	Steps int `json:"steps,omitempty" validate:"gte=0,lte=100"`
}

// EchoProgress is the progress of demo.echo: the steps done.
type EchoProgress struct {
	Done int `json:"done"`
}

// EchoResult is the result of demo.echo.
type EchoResult struct {
	Text string `json:"text"`
	// Attempt is the run that produced the result.
	Attempt int `json:"attempt"`
	// From is the step the run resumed from (a rewind's, a fork's); zero
	// for a run from the start.
	From int `json:"from,omitempty"`
}

// Echo is the kind of demo.echo.
var Echo = api.Kind[EchoParams, EchoResult]{ID: "demo.echo"}

// EchoBehavior echoes its params' text. Each submit is its own task.
type EchoBehavior struct{}

// Kind returns Echo.
func (EchoBehavior) Kind() api.Kind[EchoParams, EchoResult] { return Echo }

// TaskID returns a unique id.
func (EchoBehavior) TaskID(ids spi.IDs, _ EchoParams) api.TaskID { return ids.Unique() }

// Policy keeps the checkpoints of its runs as steps.
func (EchoBehavior) Policy() spi.Policy { return spi.Policy{KeepSteps: true} }

// Run echoes p.Text after p.DelayMS and p.Steps.
func (EchoBehavior) Run(ctx context.Context, rc spi.RunContext, p EchoParams) (EchoResult, error) {
	if p.DelayMS > 0 {
		if err := spi.Sleep(ctx, time.Duration(p.DelayMS)*time.Millisecond); err != nil {
			return EchoResult{}, err
		}
	}
	var progress EchoProgress
	if _, err := rc.Progress(&progress); err != nil {
		return EchoResult{}, err
	}
	from := progress.Done
	for progress.Done < p.Steps {
		progress.Done++
		if err := rc.Checkpoint(ctx, progress); err != nil {
			return EchoResult{}, err
		}
	}
	text := p.Text
	if p.Upper {
		text = strings.ToUpper(text)
	}
	return EchoResult{Text: text, Attempt: rc.Attempt(), From: from}, nil
}

// Register adds the demo behaviors to r.
func Register(r *spi.Registry) error {
	return spi.Register(r, spi.Behavior[EchoParams, EchoResult](EchoBehavior{}))
}
