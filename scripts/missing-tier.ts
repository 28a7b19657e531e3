// Placeholder entry for test tiers whose suites do not exist yet (sanity, e2e): says so and fails,
// so a pipeline that calls them cannot mistake "nothing ran" for success.
const tier = process.argv[2] ?? "this tier";
process.stderr.write(`${tier}: no suite exists yet in this tree; nothing was run\n`);
process.exit(2);
