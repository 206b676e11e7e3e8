DROP FUNCTION stint_submit_refused(text, text, text, text, text);
