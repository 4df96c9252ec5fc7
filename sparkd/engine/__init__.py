"""sparkd-engine: the embedded GGUF MoE engine. Never imports the supervisor (sparkd.*)."""
