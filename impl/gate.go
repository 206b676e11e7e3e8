package impl

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// gateParams are the params of a gate node's task (api.Gate).
type gateParams struct {
	Topic string `json:"topic"`
	// Timeout is a Go duration string.
	Timeout string `json:"timeout"`
}

// gateProgress is a gate's checkpoint: when it stops waiting.
type gateProgress struct {
	Deadline time.Time `json:"deadline"`
}

var gateKind = api.Kind[gateParams, json.RawMessage]{ID: api.GateBehavior}

// gateRunner is api.GateBehavior: its run succeeds with the first message
// of its topic as its result, and sleeps on the topic until one comes or
// its deadline, set at its first run, passes.
type gateRunner struct{}

func (gateRunner) Kind() api.Kind[gateParams, json.RawMessage] { return gateKind }

func (gateRunner) TaskID(ids spi.IDs, _ gateParams) api.TaskID { return ids.Unique() }

// gateTimeout parses a gate's timeout: more than zero, at most 100 years.
func gateTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > maxRetention {
		return 0, fmt.Errorf("timeout %q must be a duration over zero and at most 100 years", s)
	}
	return d, nil
}

func (gateRunner) Run(ctx context.Context, rc spi.RunContext, p gateParams) (json.RawMessage, error) {
	timeout, err := gateTimeout(p.Timeout)
	if err != nil {
		return nil, api.Permanent("invalid_params", "gate: %v", err)
	}
	var pr gateProgress
	started, err := rc.Progress(&pr)
	if err != nil {
		return nil, err
	}
	if !started {
		pr.Deadline = time.Now().Add(timeout)
		if err := rc.Checkpoint(ctx, pr); err != nil {
			return nil, err
		}
	}
	sg, ok, err := rc.Receive(ctx, p.Topic)
	if err != nil {
		return nil, err
	}
	if ok {
		return sg.Payload, nil
	}
	left := time.Until(pr.Deadline)
	if left <= 0 {
		return nil, api.Permanent("timeout", "no signal %s came within %s", p.Topic, timeout)
	}
	return nil, spi.WaitForSignal(p.Topic, left)
}

// builtinBehaviors are the behaviors every server runs, whatever its
// ServerConfig.Behaviors: the workflows' own tasks and their gate and
// sub-workflow nodes.
var builtinBehaviors = []api.BehaviorID{api.WorkflowBehavior, api.GateBehavior, api.SubworkflowBehavior}

// registerBuiltins registers the behaviors every process knows, unless
// reg has them: the gate nodes' and the sub-workflow nodes' (a client
// submits them in workflows).
// A process made at the same time on the same registry may register
// them first; either one serves.
func registerBuiltins(reg *spi.Registry) {
	if _, ok := reg.Lookup(api.GateBehavior); !ok {
		_ = spi.Register[gateParams, json.RawMessage](reg, gateRunner{})
	}
	if _, ok := reg.Lookup(api.SubworkflowBehavior); !ok {
		_ = spi.Register[subworkflowParams, WorkflowResult](reg, subworkflowRunner{})
	}
}

// gateTask returns the task of the gate node n, checked.
func gateTask(n api.WorkflowNode) (api.SubmitRequest, error) {
	if n.Task.Behavior != "" || len(n.Task.Params) > 0 {
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: a gate runs no task: leave task's behavior and params empty", n.Name)
	}
	if err := checkName("topic", n.Gate.Topic); err != nil {
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: gate: %v", n.Name, err)
	}
	if _, err := gateTimeout(n.Gate.Timeout.String()); err != nil {
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: gate: %v", n.Name, err)
	}
	params, err := json.Marshal(gateParams{Topic: n.Gate.Topic, Timeout: n.Gate.Timeout.String()})
	if err != nil {
		return api.SubmitRequest{}, fmt.Errorf("node %q: encode gate: %w", n.Name, err)
	}
	t := n.Task
	t.Behavior, t.Params = api.GateBehavior, params
	return t, nil
}
