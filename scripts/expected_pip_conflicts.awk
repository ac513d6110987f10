# Filters pip's stderr (bootstrap.sh): the dependency conflicts of the pins bootstrap.sh
# works around on purpose (TFF's jax/jaxlib 0.4.14, google-vizier's grpcio-tools,
# tensorflow-metadata's protobuf < 4.21: requirements/constraints.txt, overrides.txt) are
# replaced by one line saying so; everything else pip says, other conflicts included,
# passes unchanged.
#
#   "$venv/bin/python" -m pip install ... 2> >(awk -f scripts/expected_pip_conflicts.awk >&2)
/^ERROR: pip's dependency resolver does not currently take into account/ {
  header = $0; in_block = 1; next
}
in_block && /^(tensorflow-federated|google-vizier|tensorflow-metadata) / { expected++; next }
in_block && /(requires|has requirement) / {
  if (header != "") { print header; header = "" }
  print; next
}
{ in_block = 0; print }
END {
  if (expected) {
    printf "bootstrap: pip reports %d dependency conflict(s) of the pins set on purpose" \
           " (TFF's jax/jaxlib 0.4.14, google-vizier's grpcio-tools, tensorflow-metadata's" \
           " protobuf < 4.21; see requirements/overrides.txt): expected, nothing to fix\n", expected
  }
}
