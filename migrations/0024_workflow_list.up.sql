-- stint_task_workflow holds the workflows' own tasks (behavior
-- stint.workflow) in id order: a list of workflows walks it and reads no
-- other task, however many there are.
CREATE INDEX stint_task_workflow ON stint_task (id) WHERE behavior = 'stint.workflow';
