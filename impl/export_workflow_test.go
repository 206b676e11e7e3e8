package impl

// WorkflowsWaiting returns how many of c's SubmitWorkflows wait in
// batches not sent yet (callers that gave up left out).
func WorkflowsWaiting(c *Client) int { return c.workflows.waiting() }
