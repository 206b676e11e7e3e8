DROP INDEX stint_due_order;
CREATE INDEX stint_due_order ON stint_due (priority, due) WHERE NOT parked;
