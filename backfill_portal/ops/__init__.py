"""Operations endpoints: Prometheus metrics, liveness and readiness. Part of the HTTP
layer: it reads every app's rows, and nothing below imports it."""
