DROP TABLE stint_history_sample;
DROP TABLE stint_history;
