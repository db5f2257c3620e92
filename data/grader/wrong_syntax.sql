-- Wrong: a typo. The grader reports it; it does not crash.
SELEC id FROM job WHERE status = 'PENDING' LIMIT 1 FOR UPDATE SKIP LOCKED;
