// Second-opinion validator: node validate.js SCHEMA.json DOC.json
// Prints {"valid":bool,"errors":[{"instancePath","keyword"}]} using ajv's
// draft 2020-12 validator, all errors, unknown formats ignored (the "mac"
// format is Machina's own; the pattern beside it carries the same rule).
"use strict";
const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020");
const ajv = new Ajv2020({ allErrors: true, strict: false, validateFormats: false });
const schema = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const doc = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const validate = ajv.compile(schema);
const valid = validate(doc);
const errors = (validate.errors || []).map((e) => ({ instancePath: e.instancePath, keyword: e.keyword }));
process.stdout.write(JSON.stringify({ valid, errors }) + "\n");
