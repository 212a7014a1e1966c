# Thin shortcuts: every recipe calls a script, so nothing needs `just`.

# Start (or reuse) PostgreSQL and the Kafka-protocol broker
up:
    scripts/services up

# Stop what `up` started in this clone
down:
    scripts/services down

# The demo: services, orders, a poison event, the summary
demo:
    scripts/demo

# fmt, clippy and every test, as CI runs them
test:
    scripts/test

# Random faults under load for CHAOS_DURATION seconds (default 600)
chaos:
    scripts/chaos

# The benchmarks beside their baselines
bench *ARGS:
    scripts/bench {{ARGS}}

# Place orders at a rate for a duration: just load --rate 200 --duration 30s
load *ARGS:
    scripts/load {{ARGS}}

# List dead letters: just dlt-list --reason invalid-json
dlt-list *ARGS:
    cargo run --quiet -p inventory-service -- dlt list {{ARGS}}

# Redrive dead letters once the cause is fixed: just redrive --dry-run
redrive *ARGS:
    cargo run --quiet -p inventory-service -- dlt redrive {{ARGS}}
