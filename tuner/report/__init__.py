"""The outcome of a tune on disk, in three steps: measure once, render, write.

measuring (measure_report -> outcome.TuneReport: shares, latency, execution path), the pure renderers of
(TuneResult, TuneReport) -- oplists, json_report, markdown, search_page (+ plot), verdict (the typed sentence) --
and writer (write_outputs: staging, commit order, OutputError). checkpoint saves and loads the converted weights
(tuner.load); metric_text is how every output writes a metric. File names: tuner.core.output_files.
"""
