// The mixin's configuration. Override any field when importing it:
//   (import 'verl-exporter/mixin/mixin.libsonnet') + { _config+:: { grafanaURL: 'https://grafana.example' } }
{
  _config+:: {
    // Base of every alert's runbook_url, before #<alert name in lower case>: the exporter serves the
    // runbook at /runbook; point it at a wiki or a copy of alerts/RUNBOOK.md where readers reach that.
    runbookURL: 'http://localhost:9945/runbook',
    // The Grafana of every alert's dashboard_url (the run's, the node's or the fleet's dashboard,
    // its variables filled from the alert's labels).
    grafanaURL: 'http://localhost:3000',
  },
}
