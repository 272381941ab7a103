#!/usr/bin/env python3
"""pycocotools' COCOeval (bbox) on a ground-truth file and a results file.

Usage: coco_eval_reference.py GT.json DT.json

Prints the 12 COCOeval.stats, one a line, then one line
"category ID AP" per ground-truth category (AP@[.5:.95], area all, 100
detections, -1 without ground truth), each number as repr() writes it so that
it reads back exactly. tests/unit/test_coco_eval.cpp compares the C++
evaluator (trainers/detection/coco_eval.h) against it.
"""
import contextlib
import io
import sys


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    # COCO() and COCOeval report progress on stdout, which carries the numbers.
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(argv[1])
        results = truth.loadRes(argv[2])
        evaluation = COCOeval(truth, results, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()

    for value in evaluation.stats:
        print(repr(float(value)))
    precision = evaluation.eval["precision"]  # [threshold, recall, category, area, maxDets]
    for k, category_id in enumerate(evaluation.params.catIds):
        values = precision[:, :, k, 0, -1]
        measured = values[values > -1]
        ap = float(measured.mean()) if measured.size else -1.0
        print("category", int(category_id), repr(ap))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
