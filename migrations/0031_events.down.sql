DROP TABLE stint_event;
