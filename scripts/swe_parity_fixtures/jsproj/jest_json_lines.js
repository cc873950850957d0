// Turns `jest --json` output (stdin) into `[PASSED] full name` / `[FAILED] full name` lines,
// the shape swebench's parse_log_jest_json reads (its JEST_JSON_JQ_TRANSFORM does this in jq).
let input = '';
process.stdin.on('data', (d) => (input += d));
process.stdin.on('end', () => {
  const report = JSON.parse(input);
  for (const file of report.testResults) {
    for (const t of file.assertionResults) {
      if (t.status === 'passed' || t.status === 'failed') {
        console.log(`[${t.status.toUpperCase()}] ${[...t.ancestorTitles, t.title].join(' ')}`);
      }
    }
  }
});
