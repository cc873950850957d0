import { describe, test, expect } from 'vitest';
import calc from '../calc.js';

describe('calc', () => {
  test('adds', () => expect(calc.add(1, 2)).toBe(3));
  test('subtracts', () => expect(calc.sub(3, 1)).toBe(2));
  test.skip('skipped one', () => {});
  describe('nested', () => {
    test('adds again', () => expect(calc.add(2, 2)).toBe(4));
  });
});
test('top level', () => expect(true).toBe(true));
