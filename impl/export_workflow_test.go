package impl

// WorkflowsWaiting returns how many of c's SubmitWorkflows wait in
// batches not sent yet (callers that gave up left out).
func WorkflowsWaiting(c *Client) int {
	c.workflows.mu.Lock()
	defer c.workflows.mu.Unlock()
	n := 0
	for _, b := range c.workflows.queue {
		for _, e := range b.entries {
			if !e.gone {
				n++
			}
		}
	}
	return n
}
