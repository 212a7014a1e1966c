// Drives Debian's Chromium (headless, through playwright-core) through the
// operations console and the services' /docs pages, as an operator would.
// tests/e2e/tests/e2e/console.rs sets the scene and runs this with:
//   CONSOLE_URL   the console's page, e.g. http://127.0.0.1:8090
//   ADMIN_TOKEN   the console's admin token, which a redrive needs
//   MESSAGE_ID    a dead-lettered message (retries-exhausted, cause fixed)
//   ORDER_ID      its order, PENDING until the redrive is applied
//   DOCS_URLS     name=url,... of every service whose /docs must work offline
//   SCREENSHOTS   where the screenshots go
// Every step prints one line; any failed expectation exits non-zero.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const consoleUrl = env("CONSOLE_URL");
const adminToken = env("ADMIN_TOKEN");
const messageId = env("MESSAGE_ID");
const orderId = env("ORDER_ID");
const screenshots = env("SCREENSHOTS");
const docs = env("DOCS_URLS").split(",").map((pair) => pair.split("="));
mkdirSync(screenshots, { recursive: true });

const step = (text) => console.log(`ok - ${text}`);
const expect = (condition, text) => {
  if (!condition) throw new Error(`expected: ${text}`);
};
const isLoopback = (url) => /^(https?|wss?):\/\/(127\.0\.0\.1|localhost|\[::1\])(:\d+)?\//.test(url) || url.startsWith("data:");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    // (launch() gives it a fresh profile directory of its own.)
    "--no-first-run",
    // The network is off: no name but loopback resolves.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
  ],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
// Anything that would leave the machine is refused and remembered.
const escaped = [];
await context.route("**/*", (route) => {
  const url = route.request().url();
  if (isLoopback(url)) return route.continue();
  escaped.push(url);
  return route.abort("internetdisconnected");
});
const page = await context.newPage();
const shot = async (name) => {
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true });
  step(`screenshot ${name}.png`);
};

try {
  // The health page.
  await page.goto(`${consoleUrl}/`);
  expect((await page.locator("h1").textContent()) === "Pipeline health", "the health page");
  const dltDepth = await page.locator(".dlt-depth").first().textContent();
  expect(Number(dltDepth) >= 1, `pedido.eventos.dlt holds the dead letter (depth ${dltDepth})`);
  step(`health page: pedido.eventos.dlt depth ${dltDepth}; alerts: ${(await page.locator("#alerts").innerText()).replaceAll("\n", " | ")}`);
  await shot("console-health");

  // Search the message id: its journey, up to the dead letter.
  await page.fill("#journey-id", messageId);
  await page.click("#journey-search");
  await page.waitForSelector("#journey-steps");
  const whats = await page.locator("#journey-steps td.what").allTextContents();
  expect(whats.includes("dead-lettered"), `the journey shows the dead letter (${whats})`);
  expect(!whats.includes("processed"), "not processed yet");
  step(`journey of ${messageId}: ${whats.join(" > ")}`);
  await shot("console-journey-dead-lettered");

  // The dead letter itself.
  await page.goto(`${consoleUrl}/dead-letters?topic=pedido.eventos.dlt&key=${orderId}`);
  const rows = page.locator("tr.dead-letter");
  expect((await rows.count()) === 1, "one dead letter for the order");
  await shot("console-dead-letters");
  await rows.first().locator("a").click();
  await page.waitForSelector("#dead-letter");
  const reason = await page.locator("#reason").textContent();
  expect(reason === "retries-exhausted", `reason retries-exhausted (${reason})`);
  const value = await page.locator("#value").textContent();
  expect(value.includes(`"pedidoId": "${orderId}"`), "the value, pretty-printed");
  step(`dead letter ${page.url().replace(consoleUrl, "")}: reason ${reason}`);
  await shot("console-dead-letter");
  const letterUrl = page.url();

  // Without the admin token (the browser's own check bypassed, as a
  // forged form would be): refused, nothing published.
  await page.fill("#operator", "browser-test");
  await page.locator("#token").evaluate((input) => input.removeAttribute("required"));
  await page.click("#redrive");
  expect((await page.locator("p.alert").textContent()).includes("admin token"), "refused without the admin token");
  step("redrive without the admin token: refused");
  await page.goto(letterUrl);

  // A dry run: what would happen now, nothing published.
  await page.fill("#operator", "browser-test");
  await page.fill("#token", adminToken);
  await page.click("#redrive-dry-run");
  await page.waitForSelector("#redrive-result");
  const verdict = await page.locator("#verdict").innerText();
  expect(verdict.includes("after transient failures"), `the verdict (${verdict})`);
  expect((await page.locator("#outcome").textContent()).includes("dry run"), "nothing published");
  expect((await page.locator("#prediction-order-status").textContent()) === "PENDING", "the order still PENDING");
  step(`dry run: ${verdict.replaceAll("\n", " | ")}`);
  await shot("console-redrive-dry-run");

  // The real redrive.
  await page.goto(letterUrl);
  await page.fill("#operator", "browser-test");
  await page.fill("#token", adminToken);
  await page.click("#redrive");
  await page.waitForSelector("#redrive-result");
  const outcome = await page.locator("#outcome").textContent();
  expect(outcome.startsWith("Redriven to pedido.eventos["), `redriven (${outcome})`);
  step(`redrive: ${outcome}`);
  await shot("console-redrive");

  // The order's new state, as its journey shows it.
  await page.click("#order-link");
  let status = "";
  for (let i = 0; i < 60; i++) {
    await page.waitForSelector("#order-status");
    status = await page.locator("#order-status").textContent();
    if (status === "CONFIRMED") break;
    await page.waitForTimeout(1000);
    await page.reload();
  }
  expect(status === "CONFIRMED", `the order CONFIRMED after the redrive (${status})`);
  const orderWhats = await page.locator("#journey-steps td.what").allTextContents();
  expect(orderWhats.includes("redriven") && orderWhats.includes("record (redriven copy)"), "the redrive in the order's journey");
  step(`order ${orderId}: ${status}; ${orderWhats.join(" > ")}`);
  await shot("console-journey-after-redrive");

  // Every service's API reference, with the network off.
  for (const [name, url] of docs) {
    const before = escaped.length;
    await page.goto(`${url}/docs`);
    await page.waitForSelector(".opblock", { timeout: 15000 });
    const operations = await page.locator(".opblock-summary-path").allTextContents();
    expect(operations.length > 0, `${name}: operations listed`);
    expect(escaped.length === before, `${name}: nothing requested beyond loopback (${escaped.slice(before)})`);
    step(`${name} /docs offline: ${operations.length} operations (${operations.slice(0, 4).join(", ")}, ...)`);
    await page.screenshot({ path: join(screenshots, `docs-${name}.png`) });
    step(`screenshot docs-${name}.png`);
  }
  expect(escaped.length === 0, `no request left loopback (${escaped})`);
  step("no request left 127.0.0.1");
} finally {
  await browser.close();
}
