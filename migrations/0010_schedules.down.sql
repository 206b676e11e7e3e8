DROP TABLE stint_schedule;
