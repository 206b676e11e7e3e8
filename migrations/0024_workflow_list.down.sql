DROP INDEX stint_task_workflow;
