package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// newSignalCmd returns `stint signal`: a message to a task, or to a
// workflow's node, under a topic.
func (c *cli) newSignalCmd() *cobra.Command {
	var key, workflow, node string
	cmd := &cobra.Command{
		Use:   "signal ID TOPIC [PAYLOAD|-]",
		Short: "Send a signal to a task: a message under a topic that its runs receive",
		Long: `Send a signal to a task (api.Signals.Signal): a message under a topic, durable
once the command returns, that the task's runs receive in the order they were
sent, each once (spi.RunContext.Receive). A task asleep on the topic
(spi.WaitForSignal) is due at once; one that has not started, or is running,
receives it when its run asks. 'stint tasks show ID' lists the signals no run
has consumed yet.

PAYLOAD is JSON, given inline, as - or @- to read it from standard input, or as
@FILE; none sends null. With --key, a second signal of the task with the same
key stores nothing, consumed or not: a webhook delivered twice is received
once.

With --workflow WF --node NAME, the signal goes to the node NAME of the
workflow WF (a gate, or a node whose behavior receives it), and the arguments
are TOPIC [PAYLOAD|-].

A task that finished for good is scheduled again, and its next run receives
the signal, when its behavior is one of this program's and its policy says so
(spi.Policy.ReopenOnSignal).

Topics and keys are 1 to 128 characters from A-Z a-z 0-9 . _ : / -. Exit 1
when the task (or the workflow, or its node) does not exist or the task
finished for good (and does not reopen); 2 for a bad topic, key or payload.
Either way nothing is stored.`,
		Example: `  stint signal greeting-1 approval '{"by":"ann"}'
  cat event.json | stint signal greeting-1 bank/paid - --key webhook-8841
  stint signal --workflow release-7 --node approve approval '{"ok":true}'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case (workflow == "") != (node == ""):
				return usageErrorf("--workflow and --node go together: they name the node NAME of the workflow WF")
			case workflow != "" && (len(args) < 1 || len(args) > 2):
				return usageErrorf("%s --workflow WF --node NAME takes a TOPIC and, optionally, a PAYLOAD; got %d arguments %s",
					cmd.CommandPath(), len(args), quoteArgs(args))
			case workflow == "" && (len(args) < 2 || len(args) > 3):
				return usageErrorf("%s takes a task's ID, a TOPIC and, optionally, a PAYLOAD; got %d arguments %s",
					cmd.CommandPath(), len(args), quoteArgs(args))
			}
			return nil
		},
	}
	db := addDBFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "idempotency key: a second signal of the task with this key stores nothing")
	f.StringVar(&workflow, "workflow", "", "signal a node of this workflow (with --node) rather than a task by its ID")
	f.StringVar(&node, "node", "", "the name of the node of --workflow to signal")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		var id api.TaskID
		if workflow == "" {
			id, args = api.TaskID(args[0]), args[1:]
			if err := spi.CheckTaskID("id", id); err != nil {
				return err
			}
		}
		topic, payloadArg := args[0], ""
		if len(args) == 2 {
			payloadArg = args[1]
		}
		if payloadArg == "-" {
			payloadArg = "@-"
		}
		payload, err := readJSON("payload", "PAYLOAD", payloadArg, cmd.InOrStdin())
		if err != nil {
			return err
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		if workflow != "" {
			if id, err = web.NodeTaskID(ctx, client, api.TaskID(workflow), node); err != nil {
				return c.schemaHint(err)
			}
		}
		var opts []api.SignalOption
		if key != "" {
			opts = append(opts, api.SignalKey(key))
		}
		err = client.Signal(ctx, id, topic, payload, opts...)
		switch {
		case errors.Is(err, api.ErrNotFound):
			return fmt.Errorf("task %s not found", id)
		case err != nil:
			// The client's error names the task and, for a conflict,
			// why (see classify).
			return c.schemaHint(err)
		}
		if key != "" {
			fmt.Fprintf(c.stdout, "signal %s sent to task %s (key %s)\n", topic, id, key)
		} else {
			fmt.Fprintf(c.stdout, "signal %s sent to task %s\n", topic, id)
		}
		return nil
	}
	return cmd
}
