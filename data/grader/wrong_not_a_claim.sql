-- Wrong: a plain read. It returns ids, but locks and marks nothing.
SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1;
