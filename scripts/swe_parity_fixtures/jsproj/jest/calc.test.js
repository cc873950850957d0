const { add, sub } = require('../calc');

describe('calc', () => {
  test('adds', () => expect(add(1, 2)).toBe(3));
  test('subtracts', () => expect(sub(3, 1)).toBe(2));
  test.skip('skipped one', () => {});
  test.todo('todo one');
  describe('nested', () => {
    test('adds again', () => expect(add(2, 2)).toBe(4));
    test('waits a little', async () => {
      await new Promise((r) => setTimeout(r, 20));
      expect(add(0, 0)).toBe(0);
    });
  });
});

describe('other', () => {
  test('adds', () => expect(add(1, 1)).toBe(2));
});

test('top level ünïcode name', () => expect(true).toBe(true));
