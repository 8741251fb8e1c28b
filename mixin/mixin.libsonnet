// verl-exporter's monitoring mixin: the alerts, the recording rules and the dashboards that
// alerts/rules/ and grafana/dashboards/ ship, with one _config (config.libsonnet).
//   prometheusAlerts   the groups that hold alerts (for a PrometheusRule or a rule file)
//   prometheusRules    the groups of recording rules only (the step statistics, the fleet's figures)
//   grafanaDashboards  the dashboards, by file name
// The parts under generated/ are written by `make generate` from the same definitions as the shipped
// files: with the default _config, jsonnet gives exactly those files.
(import 'config.libsonnet') +
(import 'generated/alerts.libsonnet') +
(import 'generated/rules.libsonnet') +
(import 'generated/dashboards.libsonnet')
