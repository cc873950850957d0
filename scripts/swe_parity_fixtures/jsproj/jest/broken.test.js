// A suite that fails to load: jest reports the file as FAIL without test lines.
require('./does-not-exist');
test('never runs', () => {});
