"""``kvbench compare BASE HEAD``: two result folders, job by job, metric by metric, against
per-metric tolerances.

    load       a run or sweep folder -> its finished jobs (incomplete or failed: refused)
    match      pair BASE's jobs with HEAD's by resolved config
    tolerance  specs (exact, rel, abs, ratio, ignore) and the glob rules that pick one per metric
    diff       each pair's numeric summary columns -> one verdict per (job, metric)
    labels     how a metric reads: the catalogue's words and the unit its values are shown in
    report     the table (for the console's width) and the verdict line
    figure     compare.png
    save       the --out folder, written atomically (nothing is written without --out)
    cli        the command and its exit status (0 within, 1 beyond, 2 unusable input)
"""
